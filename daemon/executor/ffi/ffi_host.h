// The executor's host for genuine, unmodified XLA FFI handlers (DESIGN §8):
// its own XLA_FFI_Api, the XLA_FFI_CallFrame a handler sees (rebuilt from a
// LaunchFrame), the per-call execution context behind it, and XLA's handler
// metadata call (also used by kregd-probe). kregd itself links none of it.
#ifndef KREGD_DAEMON_EXECUTOR_FFI_FFI_HOST_H_
#define KREGD_DAEMON_EXECUTOR_FFI_FFI_HOST_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/wire.h"
#include "daemon/base/hosted_api.h"
#include "daemon/base/launch.h"
#include "daemon/base/types.h"
#include "daemon/executor/ffi/call_options.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {

namespace ffi_internal {
class CallFrameStorage;
class ThreadPool;
}  // namespace ffi_internal

// The call frame FfiHost built for the last call of one caller (a session),
// kept so the next call reuses it: the buffer tables are refilled in place
// and the attribute tables rebuilt only when the LaunchFrame's
// attrs_generation changed (or is 0). The LaunchFrame's attributes must stay
// unmodified while their generation is unchanged. Used by one thread at a
// time; must outlive the Executes it is passed to.
//
// The attribute tables it keeps are charged to `budget` (an executor's
// max_buffered_bytes, shared with its sessions' receive buffers; null:
// unbounded, must outlive the cache) before they are built, and given back
// when evicted or when the cache is destroyed (the session ends). When the
// budget cannot cover a new table even after evicting this cache's other
// tables, Execute fails with RESOURCE_EXHAUSTED naming max_buffered_bytes
// and the handler is not called.
class CallFrameCache {
 public:
  explicit CallFrameCache(wire::ByteBudget* budget = nullptr);
  ~CallFrameCache();
  CallFrameCache(const CallFrameCache&) = delete;
  CallFrameCache& operator=(const CallFrameCache&) = delete;

  // Bytes this cache holds of its budget (0 without one).
  uint64_t charged_bytes() const;

 private:
  friend class FfiHost;
  wire::ByteBudget* const budget_;
  std::unique_ptr<ffi_internal::CallFrameStorage> storage_;
};

struct FfiHostOptions {
  // Workers of the pool behind XLA_FFI_ThreadPool_*; 0 means
  // std::thread::hardware_concurrency().
  int num_threads = 0;
};

// Runs XLA FFI handlers at the stage CallOptions names (EXECUTE by default;
// a bundle's INSTANTIATE, PREPARE and INITIALIZE stages too, with the call
// site's state behind State_Get and State_Set). Owns the daemon-wide thread
// pool handlers schedule work on. Thread-safe: any number of concurrent
// Executes.
//
// Per call, FfiHost creates an execution context (XLA_FFI_InvokeContext)
// holding the run id, device ordinal, platform resources, the scratch memory
// the handler allocated and the futures it created; the context dies when
// Execute returns (after a returned future completed), freeing leftover
// scratch. Tasks a handler schedules must not use the context after that.
//
// What kregd does not support fails with an FFI error naming the function:
// execution-context user data (InvokeContext_Get), handler registration
// through the API (Handler_Register), streams on CPU (Stream_Get), thread
// pools on CUDA, and XLA's internal API (`internal_api` is null).
class FfiHost {
 public:
  explicit FfiHost(FfiHostOptions options = {});
  // Runs every task already queued on the pool, then joins it. No Execute may
  // be in flight.
  ~FfiHost();

  FfiHost(const FfiHost&) = delete;
  FfiHost& operator=(const FfiHost&) = delete;

  int num_threads() const;

  // Scratch bytes currently allocated by handlers of this host's live calls.
  int64_t scratch_bytes_in_use() const { return scratch_bytes_.load(); }

  // Calls `handler` (an XLA_FFI_Handler*) with a call frame built from
  // `frame`: args/rets as XLA_FFI_Buffers, attributes sorted by name, every
  // struct_size as c_api.h defines it. If the handler returns a future, waits
  // until it completes. Returns the handler's error with its message verbatim
  // and its code (XLA_FFI_Error_Code numbering is absl's); UNKNOWN if it threw
  // an exception. INVALID_ARGUMENT if `frame` cannot be expressed as a call
  // frame (unknown dtype, attribute byte count that does not match its dtype,
  // duplicate attribute name, dictionaries nested too deeply).
  absl::Status Execute(void* handler, const LaunchFrame& frame,
                       const CallOptions& options = {});

  // Converts an error made through `api` to a Status (code mapped, message
  // verbatim; codes outside absl's range become UNKNOWN) and destroys it.
  // Null is OK.
  static absl::Status ErrorToStatus(const XLA_FFI_Api* api,
                                    XLA_FFI_Error* error);

 private:
  std::unique_ptr<ffi_internal::ThreadPool> pool_;
  std::atomic<int64_t> scratch_bytes_{0};
};

// kregd's XLA_FFI_Api table (static, valid for the process's lifetime).
const XLA_FFI_Api* HostedApi();

// Makes XLA's metadata call on `handler` (a call frame whose extension_start
// is an XLA_FFI_Metadata_Extension) and returns the FFI API version the
// handler was built with, its traits and state type id. INVALID_ARGUMENT if
// the handler returns an error (its message included) or returns without
// filling the metadata (`symbol` names it in the message). Calling something
// that is not a handler may crash: run this in a disposable process.
absl::StatusOr<HandlerInfo> QueryHandlerMetadata(void* handler,
                                                 absl::string_view symbol = "");

}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_FFI_FFI_HOST_H_
