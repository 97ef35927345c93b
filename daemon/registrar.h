// The one entry point for registration requests from any front end (gRPC,
// sessions): validates the request, reads the module, calls the Registry.
#ifndef KREGD_DAEMON_REGISTRAR_H_
#define KREGD_DAEMON_REGISTRAR_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/registry.h"
#include "daemon/unique_fd.h"
#include "kreg/v1/registry.pb.h"

namespace kreg {

struct ModulePolicy {
  // Daemon-side paths are read only under these (canonical) directories.
  std::vector<std::string> allowed_roots;
  // Largest module accepted, uploaded or read from a path.
  uint64_t max_module_bytes = 512ull << 20;
};

// Opens `path` (under `root`, which is a canonical directory) for reading so
// that the kernel refuses to leave `root` while resolving it: openat2 with
// RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS from `root`, which fails with EXDEV
// on an escape (a symlink or ".." out of the root, also one swapped in after
// a realpath check). Falls back to open(O_NOFOLLOW) where openat2 does not
// exist (Linux < 5.6). On failure the result is not ok() and errno is set.
UniqueFd OpenBeneath(const std::string& root, const std::string& path);

// Checks that `path` names a regular file under one of `allowed_roots`
// after resolving symlinks and "..", that `peer` may read it, and reads it.
// PERMISSION_DENIED outside the roots or when the peer may not read it,
// NOT_FOUND when missing, INVALID_ARGUMENT when too large or not a file.
absl::StatusOr<std::string> ReadModuleForPeer(const std::string& path,
                                              const ModulePolicy& policy,
                                              const PeerCred& peer);

// Thread-safe; the registry must outlive it.
class Registrar {
 public:
  Registrar(Registry* registry, ModulePolicy policy);

  // `upload` holds the module bytes when header.module() is an upload
  // (its size must equal upload_size). Errors: INVALID_ARGUMENT for bad
  // fields (quoted), those of ReadModuleForPeer, and the registry's. Every
  // refusal here is logged at info (the registry logs its own decisions).
  absl::StatusOr<RegisterOutcome> Register(
      const v1::RegisterTargetHeader& header, std::string upload,
      const PeerCred& peer);

  const ModulePolicy& policy() const { return policy_; }

 private:
  // The edge checks: the typed request, or the first error.
  absl::StatusOr<RegisterArgs> Parse(const v1::RegisterTargetHeader& header,
                                     std::string upload, const PeerCred& peer);

  Registry* const registry_;
  const ModulePolicy policy_;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_REGISTRAR_H_
