// What a registration asks and what it gets (DESIGN §2): the types the
// Registry core, its collaborators and the Registrar share.
#ifndef KREGD_DAEMON_REGISTRY_REGISTER_ARGS_H_
#define KREGD_DAEMON_REGISTRY_REGISTER_ARGS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "daemon/base/types.h"
#include "daemon/registry/repointer.h"

namespace kreg {

// A validated registration request (see validate.h for the edge checks).
struct RegisterArgs {
  TargetKey key;
  std::string func_name;
  std::string content_id;  // empty: "sha256:<hex>" of module_bytes
  std::string module_bytes;
  std::string origin;  // "path:<p>" or "upload:<n> bytes"
  PeerCred peer;
  bool replace = false;
  // kInProcess: nothing is stored or loaded; content_id is the identity.
  TargetKind kind = TargetKind::kModule;
};

struct RegisterOutcome {
  bool created = false;  // false: identical registration existed (no-op)
  EntryPtr entry;
  // Inside the registry only: a replacement whose holders on this host
  // were re-pointed (`laggards`: those that did not switch), and the
  // deadline of that re-point (docs/replace.md §5, §9).
  bool replaced = false;
  std::vector<Repointer::Laggard> laggards;
  absl::Time deadline;
};

// The store modules `e` keeps, digest -> size: its own and every earlier
// generation's (processes may still run them: docs/replace.md).
inline std::map<std::string, uint64_t> KeptModules(const TargetEntry& e) {
  std::map<std::string, uint64_t> out;
  if (!e.module_digest.empty()) out.emplace(e.module_digest, e.module_size);
  for (const Generation& g : e.generations) {
    if (!g.module_digest.empty()) out.emplace(g.module_digest, g.module_size);
  }
  return out;
}

}  // namespace kreg

#endif  // KREGD_DAEMON_REGISTRY_REGISTER_ARGS_H_
