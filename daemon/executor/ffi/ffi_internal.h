// Internal to //daemon/executor/ffi: kregd's definitions of the XLA FFI C API's
// opaque types and the helpers shared by the API table and FfiHost.
#ifndef KREGD_DAEMON_EXECUTOR_FFI_FFI_INTERNAL_H_
#define KREGD_DAEMON_EXECUTOR_FFI_FFI_INTERNAL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "daemon/base/launch.h"
#include "daemon/base/types.h"
#include "daemon/executor/ffi/call_options.h"
#include "xla/ffi/api/c_api.h"

namespace kreg::ffi_internal {
class ThreadPool;  // thread_pool.h
}  // namespace kreg::ffi_internal

// c_api.h declares these in the global namespace; kregd defines them.

// An error value: heap object, owned by whoever holds the pointer under
// c_api.h's rules, destroyed by XLA_FFI_Error_Destroy.
struct XLA_FFI_Error {
  XLA_FFI_Error_Code errc;
  std::string message;
};

// Completion signal of an asynchronous handler. Two references: the
// producer's, dropped by XLA_FFI_Future_SetAvailable/SetError, and kregd's,
// dropped when the call that created or returned it ends. Thread-safe.
struct XLA_FFI_Future {
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  XLA_FFI_Error* error ABSL_GUARDED_BY(mu) = nullptr;  // owned
  std::atomic<int> refs{2};
};

// The execution context of one call. Lives on Execute's stack until the call
// (and its returned future) completed; the destructor frees leftover scratch
// memory and drops kregd's references to the call's futures. Thread-safe:
// handlers may use it from pool tasks while the call runs.
struct XLA_FFI_InvokeContext {
  static constexpr uint64_t kLive = 0x6b72656764637478;  // "kregdctx"

  XLA_FFI_InvokeContext(const kreg::LaunchFrame& frame,
                        const kreg::CallOptions& options,
                        kreg::ffi_internal::ThreadPool* pool,
                        std::atomic<int64_t>* scratch_gauge);
  ~XLA_FFI_InvokeContext();
  XLA_FFI_InvokeContext(const XLA_FFI_InvokeContext&) = delete;
  XLA_FFI_InvokeContext& operator=(const XLA_FFI_InvokeContext&) = delete;

  // Takes kregd's reference to `future` unless this call already holds it.
  void AdoptFuture(XLA_FFI_Future* future);

  std::atomic<uint64_t> magic{kLive};  // cleared by the destructor
  const kreg::Platform platform;
  const int64_t run_id;
  const int32_t device_ordinal;
  const kreg::CallOptions options;
  kreg::ffi_internal::ThreadPool* const pool;  // borrowed from FfiHost
  std::atomic<int64_t>* const scratch_gauge;   // borrowed from FfiHost

  absl::Mutex mu;
  absl::flat_hash_map<void*, size_t> scratch ABSL_GUARDED_BY(mu);  // owned
  std::vector<XLA_FFI_Future*> futures ABSL_GUARDED_BY(mu);  // one ref each
};

namespace kreg {
namespace ffi_internal {

XLA_FFI_Error* NewError(XLA_FFI_Error_Code errc, std::string message);

// absl's code for `errc`; UNKNOWN outside absl's range.
absl::StatusCode ToStatusCode(XLA_FFI_Error_Code errc);

// Drops one reference; the last one frees the future and its error.
void UnrefFuture(XLA_FFI_Future* future);

// Completes `future` with `error` (owned; null: available) and drops the
// producer's reference. Errors (naming `fn`) for a null or already completed
// future.
XLA_FFI_Error* CompleteFuture(absl::string_view fn, XLA_FFI_Future* future,
                              XLA_FFI_Error* error);

// Blocks until `future` completes; returns its error (a copy).
absl::Status WaitForFuture(XLA_FFI_Future* future);

// The call whose handler runs on this thread, or null (futures its handler
// creates are tracked by it). SwapCurrentCall returns the previous value.
XLA_FFI_InvokeContext* CurrentCall();
XLA_FFI_InvokeContext* SwapCurrentCall(XLA_FFI_InvokeContext* ctx);

}  // namespace ffi_internal
}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_FFI_FFI_INTERNAL_H_
