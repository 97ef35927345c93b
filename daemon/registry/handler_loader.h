// What the registry borrows to store, check and load modules: implemented
// by ModuleLoader over the module store (DESIGN §4), faked in unit tests.
#ifndef KREGD_DAEMON_REGISTRY_HANDLER_LOADER_H_
#define KREGD_DAEMON_REGISTRY_HANDLER_LOADER_H_

#include <cstdint>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/base/types.h"

namespace kreg {

// A module written for a pending registration. Nothing is in the store
// until the registration is accepted and the module committed.
struct StagedModule {
  std::string digest;  // "sha256:<hex>" of the bytes
  std::string path;    // the file the probe opens
  bool fresh = false;  // true: `path` is a temp file written by Stage; false:
                       // an intact store copy already existed
};

// What CollectGarbage removed from (and left in) the module store.
struct GcOutcome {
  uint64_t files_removed = 0;
  uint64_t bytes_removed = 0;
  uint64_t files_kept = 0;
  uint64_t bytes_kept = 0;
};

// Stores, checks and loads modules for the registry; implemented by
// ModuleLoader over the module store, faked in unit tests.
class HandlerLoader {
 public:
  virtual ~HandlerLoader() = default;
  // Writes `bytes`, whose digest ("sha256:<hex>", computed by the caller)
  // is `digest`, to a private fsynced temp file beside the store, unless an
  // intact store copy exists. INTERNAL on I/O failure.
  virtual absl::StatusOr<StagedModule> Stage(const std::string& bytes,
                                             const std::string& digest) = 0;
  // Checks (out of process) that `func_name` in the staged module is an XLA
  // FFI handler the daemon can host. INVALID_ARGUMENT/NOT_FOUND otherwise.
  virtual absl::StatusOr<HandlerInfo> Probe(const StagedModule& staged,
                                            const std::string& func_name) = 0;
  // Makes a fresh staged file the store copy of its digest (rename, fsync).
  virtual absl::Status Commit(const StagedModule& staged) = 0;
  // Removes the temp file of a fresh staged module that was not committed.
  // (A committed copy no entry references is left to RemoveUnreferenced: a
  // concurrent registration of the same bytes may be using it.)
  virtual void Discard(const StagedModule& staged) = 0;
  // Checks that the store copy executors will load is in place. kregd
  // itself never dlopens a module (DESIGN §8): executors do.
  virtual absl::Status Check(const std::string& digest) = 0;
  // Like Check, for a journaled entry at start-up: also verifies that the
  // store file still has the digest (DATA_LOSS otherwise).
  virtual absl::Status CheckStored(const std::string& digest) = 0;
  // Removes every store file whose digest is not in `keep`, and leftover
  // temp files. INTERNAL when the store cannot be listed.
  virtual absl::StatusOr<GcOutcome> RemoveUnreferenced(
      const std::set<std::string>& keep) = 0;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_REGISTRY_HANDLER_LOADER_H_
