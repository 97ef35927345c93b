#include "daemon/executor/ffi/ffi_internal.h"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/base/platform_table.h"

namespace kreg {
namespace ffi_internal {
namespace {

thread_local XLA_FFI_InvokeContext* current_call = nullptr;

}  // namespace

XLA_FFI_Error* NewError(XLA_FFI_Error_Code errc, std::string message) {
  return new XLA_FFI_Error{errc, std::move(message)};
}

absl::StatusCode ToStatusCode(XLA_FFI_Error_Code errc) {
  // XLA_FFI_Error_Code follows absl's canonical numbering (c_api.h).
  int code = static_cast<int>(errc);
  if (code < 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::StatusCode::kUnknown;
  }
  return static_cast<absl::StatusCode>(code);
}

void UnrefFuture(XLA_FFI_Future* future) {
  if (future->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  XLA_FFI_Error* error;
  {
    absl::MutexLock lock(&future->mu);
    error = future->error;
    future->error = nullptr;
  }
  delete error;
  delete future;
}

XLA_FFI_Error* CompleteFuture(absl::string_view fn, XLA_FFI_Future* future,
                              XLA_FFI_Error* error) {
  if (future == nullptr) {
    delete error;
    return NewError(XLA_FFI_Error_Code_INVALID_ARGUMENT,
                    absl::StrCat(fn, ": future is null"));
  }
  {
    absl::MutexLock lock(&future->mu);
    if (future->done) {
      delete error;
      return NewError(XLA_FFI_Error_Code_FAILED_PRECONDITION,
                      absl::StrCat(fn, ": the future is already completed"));
    }
    future->done = true;
    future->error = error;
  }
  UnrefFuture(future);
  return nullptr;
}

absl::Status WaitForFuture(XLA_FFI_Future* future) {
  absl::MutexLock lock(&future->mu);
  future->mu.Await(absl::Condition(&future->done));
  if (future->error == nullptr) return absl::OkStatus();
  return absl::Status(ToStatusCode(future->error->errc),
                      future->error->message);
}

XLA_FFI_InvokeContext* CurrentCall() { return current_call; }

XLA_FFI_InvokeContext* SwapCurrentCall(XLA_FFI_InvokeContext* ctx) {
  XLA_FFI_InvokeContext* previous = current_call;
  current_call = ctx;
  return previous;
}

}  // namespace ffi_internal
}  // namespace kreg

XLA_FFI_InvokeContext::XLA_FFI_InvokeContext(
    const kreg::LaunchFrame& frame, const kreg::CallOptions& options,
    kreg::ffi_internal::ThreadPool* pool, std::atomic<int64_t>* scratch_gauge)
    : platform(frame.platform),
      run_id(frame.run_id),
      device_ordinal(frame.device_ordinal),
      options(options),
      pool(pool),
      scratch_gauge(scratch_gauge) {}

XLA_FFI_InvokeContext::~XLA_FFI_InvokeContext() {
  magic.store(0);
  absl::flat_hash_map<void*, size_t> leftover;
  std::vector<XLA_FFI_Future*> call_futures;
  {
    absl::MutexLock lock(&mu);
    leftover.swap(scratch);
    call_futures.swap(futures);
  }
  int64_t freed = 0;
  for (const auto& [data, size] : leftover) {
    freed += static_cast<int64_t>(size);
    if (kreg::TraitsOf(platform).memory == kreg::PlatformMemory::kHost) {
      std::free(data);
    } else if (options.device_allocator != nullptr) {
      absl::Status status = options.device_allocator->Free(data, size);
      if (!status.ok()) {
        spdlog::error(
            "freeing {} bytes of scratch memory left by a handler "
            "failed: {}",
            size, status.ToString());
      }
    }
  }
  if (!leftover.empty()) {
    spdlog::debug("freed {} scratch allocation(s) ({} bytes) a handler left",
                  leftover.size(), freed);
    scratch_gauge->fetch_sub(freed);
  }
  for (XLA_FFI_Future* future : call_futures) {
    kreg::ffi_internal::UnrefFuture(future);
  }
}

void XLA_FFI_InvokeContext::AdoptFuture(XLA_FFI_Future* future) {
  absl::MutexLock lock(&mu);
  for (XLA_FFI_Future* held : futures) {
    if (held == future) return;
  }
  futures.push_back(future);
}
