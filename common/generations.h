// The one refusal of a pinned generation (docs/replace.md §7), said by kregd
// when it resolves a pinned binding and by the client library when it binds
// one.
#ifndef KREGD_COMMON_GENERATIONS_H_
#define KREGD_COMMON_GENERATIONS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace kreg {

// Why (`name`, `platform`) cannot be bound at `generation`: its generations
// are `have` (oldest first, the current one last; empty when the key is not
// registered).
std::string NoSuchGeneration(const std::string& name,
                             const std::string& platform, uint32_t generation,
                             const std::vector<uint32_t>& have);

}  // namespace kreg

#endif  // KREGD_COMMON_GENERATIONS_H_
