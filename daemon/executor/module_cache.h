// The modules one executor has loaded (DESIGN §8): store copies kregd hands
// over as read-only descriptors, dlopen'ed once and never unloaded.
#ifndef KREGD_DAEMON_EXECUTOR_MODULE_CACHE_H_
#define KREGD_DAEMON_EXECUTOR_MODULE_CACHE_H_

#include <array>
#include <map>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/handler_spec.h"
#include "common/unique_fd.h"

namespace kreg {

// Thread-safe. Each module is copied from kregd's descriptor into a memfd
// the executor owns (its uid may not open kregd's store directory) and
// dlopen'ed from /proc/self/fd/N; the memfd stays open for the process's
// lifetime, so that path is never reused for other bytes.
class ModuleCache {
 public:
  ModuleCache() = default;
  ModuleCache(const ModuleCache&) = delete;
  ModuleCache& operator=(const ModuleCache&) = delete;

  // The XLA FFI handler `func_name` of the module whose digest is `digest`;
  // `module_fd` (a read-only descriptor of its store copy) is read only the
  // first time the digest is seen. INTERNAL when it cannot be loaded,
  // NOT_FOUND naming the symbol when it is missing.
  absl::StatusOr<void*> Handler(const std::string& digest, UniqueFd module_fd,
                                const std::string& func_name);

  // Every stage's handler of the bundle `func_name` names
  // (common/handler_spec.h; a plain symbol: execute only), after
  // registering its state type with the executor's FfiHost
  // (XLA_FFI_Type_Register, as jax.ffi.register_ffi_type does in-process).
  // Errors as Handler's; the type's registration error verbatim.
  absl::StatusOr<std::array<void*, kNumHandlerStages>> Bundle(
      const std::string& digest, UniqueFd module_fd,
      const std::string& func_name);

  size_t size() const;

 private:
  struct Module {
    UniqueFd memfd;
    void* handle = nullptr;
  };
  absl::StatusOr<void*> Load(const std::string& digest, int module_fd);
  // The module `digest` (loaded from `module_fd` the first time).
  absl::StatusOr<void*> ModuleOf(const std::string& digest,
                                 const UniqueFd& module_fd)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<void*> Symbol(void* handle, const std::string& digest,
                               const std::string& name);

  mutable absl::Mutex mu_;
  std::map<std::string, Module> modules_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, std::string>,
           std::array<void*, kNumHandlerStages>>
      bundles_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_MODULE_CACHE_H_
