// Process-wide registry behind XLA_FFI_Type_Register.
#ifndef KREGD_DAEMON_EXECUTOR_FFI_TYPE_REGISTRY_H_
#define KREGD_DAEMON_EXECUTOR_FFI_TYPE_REGISTRY_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace ffi_internal {

// Maps user type names to XLA FFI type ids. Process-wide, like XLA's own
// registry: XLA_FFI_Type_Register carries no context, and the TypeId
// variables it fills live in modules shared by every client. Thread-safe.
class TypeRegistry {
 public:
  static TypeRegistry& Global();

  // `*type_id` 0 (XLA_FFI_UNKNOWN_TYPE_ID): assigns a fresh id, or returns the
  // id `name` already has (idempotent). Non-zero: records it for `name`;
  // ALREADY_EXISTS if `name` has another id or the id belongs to another name.
  // INVALID_ARGUMENT for an empty name or a negative id.
  absl::Status Register(absl::string_view name, XLA_FFI_TypeId* type_id,
                        const XLA_FFI_TypeInfo* type_info);

  // The deleter registered for `type_id`, or null.
  using Deleter = void (*)(void*);
  Deleter DeleterOf(int64_t type_id);

 private:
  struct Entry {
    std::string name;
    Deleter deleter = nullptr;
  };

  absl::Mutex mu_;
  std::map<std::string, int64_t, std::less<>> ids_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace ffi_internal
}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_FFI_TYPE_REGISTRY_H_
