// The exported functions of an ELF shared library, read from its dynamic
// symbol table without loading it, and a "did you mean" ordering. Used by
// kregd-probe to say what a module offers when a symbol is missing.
#ifndef KREGD_DAEMON_EXECUTOR_ELF_SYMBOLS_H_
#define KREGD_DAEMON_EXECUTOR_ELF_SYMBOLS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/base/edit_distance.h"

namespace kreg {

// Names of the defined, default-visibility global or weak functions in
// `image`'s .dynsym that could be XLA FFI handlers: C symbol names, not
// C++-mangled ("_Z...") and not starting with '_'. Sorted, unique.
// INVALID_ARGUMENT for anything but a well-formed 64-bit little-endian ELF
// (every offset is bounds-checked).
absl::StatusOr<std::vector<std::string>> HandlerLikeExports(
    absl::string_view image);

// At most `max` of `names`, closest to `wanted` first (edit distance, then
// name).
std::vector<std::string> ClosestFirst(std::vector<std::string> names,
                                      absl::string_view wanted, size_t max);

}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_ELF_SYMBOLS_H_
