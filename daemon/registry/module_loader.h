// HandlerLoader over the module store and the out-of-process probe.
#ifndef KREGD_DAEMON_REGISTRY_MODULE_LOADER_H_
#define KREGD_DAEMON_REGISTRY_MODULE_LOADER_H_

#include <string>

#include "daemon/registry/handler_loader.h"
#include "daemon/store/module_store.h"

namespace kreg {

// Runs `probe_binary <module path> <symbol or handler bundle>` (posix_spawn, no
// fork of the daemon) and parses its report. INVALID_ARGUMENT when the helper
// reports that the symbol is missing (listing the module's exported functions,
// closest first) or is not a handler, or when it crashes or has not reported
// within `timeout_s` (it is killed then); messages name the module
// (`display_name`) and the symbol.
absl::StatusOr<HandlerInfo> ProbeHandler(const std::string& probe_binary,
                                         const std::string& module_path,
                                         const std::string& display_name,
                                         const std::string& symbol,
                                         double timeout_s);

// Checks a probed handler against what kregd can host: FFI API version
// (same major as kHostedApiMajor, minor not newer), and per-instance state
// only from a bundle's instantiate stage (`has_instantiate`).
// INVALID_ARGUMENT naming both versions, or the state, otherwise.
absl::Status CheckHostable(const HandlerInfo& info, const std::string& symbol,
                           bool has_instantiate = false);

// Borrowed store must outlive the loader. Thread-safe.
class ModuleLoader : public HandlerLoader {
 public:
  ModuleLoader(ModuleStore* store, std::string probe_binary,
               double probe_timeout_s);

  absl::StatusOr<StagedModule> Stage(const std::string& bytes,
                                     const std::string& digest) override;
  absl::StatusOr<HandlerInfo> Probe(const StagedModule& staged,
                                    const std::string& func_name) override;
  absl::Status Commit(const StagedModule& staged) override;
  void Discard(const StagedModule& staged) override;
  absl::StatusOr<GcOutcome> RemoveUnreferenced(
      const std::set<std::string>& keep) override;
  absl::Status Check(const std::string& digest) override;
  absl::Status CheckStored(const std::string& digest) override;

 private:
  ModuleStore* const store_;
  const std::string probe_binary_;
  const double probe_timeout_s_;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_REGISTRY_MODULE_LOADER_H_
