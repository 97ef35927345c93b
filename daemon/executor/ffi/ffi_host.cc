#include "daemon/executor/ffi/ffi_host.h"

#include <exception>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/stage_trace.h"
#include "daemon/executor/ffi/call_frame.h"
#include "daemon/executor/ffi/ffi_internal.h"
#include "daemon/executor/ffi/thread_pool.h"
#include "daemon/executor/ffi/type_registry.h"

namespace kreg {
namespace {

int ResolveNumThreads(int requested) {
  if (requested > 0) return requested;
  unsigned hardware = std::thread::hardware_concurrency();
  return hardware > 0 ? static_cast<int>(hardware) : 1;
}

// Calls `handler`; a C++ exception escaping it becomes UNKNOWN (handlers are
// C++ and may throw; it must not unwind through kregd).
absl::StatusOr<XLA_FFI_Error*> InvokeHandler(void* handler,
                                             XLA_FFI_CallFrame* frame) {
  try {
    return reinterpret_cast<XLA_FFI_Handler*>(handler)(frame);
  } catch (const std::exception& e) {
    return absl::UnknownError(
        absl::StrCat("XLA FFI handler threw an exception: ", e.what()));
  } catch (...) {
    return absl::UnknownError(
        "XLA FFI handler threw an exception that is not a std::exception");
  }
}

// Marks `ctx` as the call whose handler runs on this thread.
class ScopedCurrentCall {
 public:
  explicit ScopedCurrentCall(XLA_FFI_InvokeContext* ctx)
      : previous_(ffi_internal::SwapCurrentCall(ctx)) {}
  ~ScopedCurrentCall() { ffi_internal::SwapCurrentCall(previous_); }
  ScopedCurrentCall(const ScopedCurrentCall&) = delete;
  ScopedCurrentCall& operator=(const ScopedCurrentCall&) = delete;

 private:
  XLA_FFI_InvokeContext* previous_;
};

}  // namespace

CallFrameCache::CallFrameCache(wire::ByteBudget* budget) : budget_(budget) {}
CallFrameCache::~CallFrameCache() = default;

uint64_t CallFrameCache::charged_bytes() const {
  return storage_ == nullptr ? 0 : storage_->charged_bytes();
}

FfiHost::FfiHost(FfiHostOptions options)
    : pool_(std::make_unique<ffi_internal::ThreadPool>(
          ResolveNumThreads(options.num_threads))) {}

FfiHost::~FfiHost() = default;

int FfiHost::num_threads() const { return pool_->num_threads(); }

absl::Status FfiHost::ErrorToStatus(const XLA_FFI_Api* api,
                                    XLA_FFI_Error* error) {
  if (error == nullptr) return absl::OkStatus();
  XLA_FFI_Error_GetDetails_Args details;
  details.struct_size = XLA_FFI_Error_GetDetails_Args_STRUCT_SIZE;
  details.extension_start = nullptr;
  details.error = error;
  details.message = nullptr;
  details.errc = XLA_FFI_Error_Code_UNKNOWN;
  api->XLA_FFI_Error_GetDetails(&details);
  absl::Status status(ffi_internal::ToStatusCode(details.errc),
                      details.message != nullptr ? details.message : "");

  XLA_FFI_Error_Destroy_Args destroy;
  destroy.struct_size = XLA_FFI_Error_Destroy_Args_STRUCT_SIZE;
  destroy.extension_start = nullptr;
  destroy.error = error;
  api->XLA_FFI_Error_Destroy(&destroy);
  return status;
}

absl::Status FfiHost::Execute(void* handler, const LaunchFrame& frame,
                              const CallOptions& options) {
  if (handler == nullptr) {
    return absl::InvalidArgumentError("FfiHost::Execute: handler is null");
  }
  std::unique_ptr<ffi_internal::CallFrameStorage> own;
  ffi_internal::CallFrameStorage* storage;
  if (options.frame_cache != nullptr) {
    std::unique_ptr<ffi_internal::CallFrameStorage>& kept =
        options.frame_cache->storage_;
    if (kept == nullptr) {
      kept = std::make_unique<ffi_internal::CallFrameStorage>(
          options.frame_cache->budget_);
    }
    storage = kept.get();
  } else {
    own = std::make_unique<ffi_internal::CallFrameStorage>();
    storage = own.get();
  }
  if (absl::Status s = storage->Prepare(frame); !s.ok()) return s;

  // Destroyed before the storage is reused or freed, after any returned
  // future completed.
  XLA_FFI_InvokeContext ctx(frame, options, pool_.get(), &scratch_bytes_);
  XLA_FFI_CallFrame* call_frame = storage->frame();
  call_frame->api = HostedApi();
  call_frame->ctx = &ctx;
  call_frame->stage = options.stage;

  absl::StatusOr<XLA_FFI_Error*> returned;
  {
    ScopedCurrentCall current(&ctx);
    stage::Mark(stage::kHandlerStart);
    returned = InvokeHandler(handler, call_frame);
    stage::Mark(stage::kHandlerEnd);
  }
  absl::Status status =
      returned.ok() ? ErrorToStatus(HostedApi(), *returned) : returned.status();

  if (call_frame->future != nullptr) {
    // XLA keeps args, rets and attrs alive until the future completes; so do
    // we (even if the handler also returned an error, which ffi.h never does).
    ctx.AdoptFuture(call_frame->future);
    absl::Status async = ffi_internal::WaitForFuture(call_frame->future);
    if (status.ok()) status = async;
  }
  return status;
}

bool DestroyState(const HostedState& state) {
  if (state.ptr == nullptr) return true;
  ffi_internal::TypeRegistry::Deleter deleter =
      ffi_internal::TypeRegistry::Global().DeleterOf(state.type_id);
  if (deleter == nullptr) return false;
  deleter(state.ptr);
  return true;
}

absl::StatusOr<HandlerInfo> QueryHandlerMetadata(void* handler,
                                                 absl::string_view symbol) {
  const std::string what =
      symbol.empty() ? "symbol" : absl::StrCat("symbol \"", symbol, "\"");
  if (handler == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is null"));
  }

  // A handler writes api_version.struct_size; 0 afterwards means nobody
  // answered.
  XLA_FFI_Metadata metadata{};
  metadata.struct_size = XLA_FFI_Metadata_STRUCT_SIZE;
  metadata.api_version = XLA_FFI_Api_Version{0, nullptr, -1, -1};
  metadata.traits = 0;
  metadata.state_type_id = XLA_FFI_TypeId{0};

  XLA_FFI_Metadata_Extension extension{};
  extension.extension_base =
      XLA_FFI_InternalExtension{XLA_FFI_Metadata_Extension_STRUCT_SIZE,
                                XLA_FFI_Extension_Metadata, nullptr};
  extension.metadata = &metadata;

  XLA_FFI_CallFrame frame{};
  frame.struct_size = XLA_FFI_CallFrame_STRUCT_SIZE;
  frame.extension_start = &extension.extension_base;
  frame.api = HostedApi();
  frame.ctx = nullptr;
  frame.stage = XLA_FFI_ExecutionStage_EXECUTE;
  frame.args =
      XLA_FFI_Args{XLA_FFI_Args_STRUCT_SIZE, nullptr, 0, nullptr, nullptr};
  frame.rets =
      XLA_FFI_Rets{XLA_FFI_Rets_STRUCT_SIZE, nullptr, 0, nullptr, nullptr};
  frame.attrs = XLA_FFI_Attrs{
      XLA_FFI_Attrs_STRUCT_SIZE, nullptr, 0, nullptr, nullptr, nullptr};
  frame.future = nullptr;

  absl::StatusOr<XLA_FFI_Error*> returned = InvokeHandler(handler, &frame);
  absl::Status status = returned.ok()
                            ? FfiHost::ErrorToStatus(HostedApi(), *returned)
                            : returned.status();
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " failed XLA FFI's metadata call: ", status.message()));
  }
  if (metadata.api_version.struct_size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     " does not answer XLA FFI's metadata call; it is not an "
                     "XLA FFI handler"));
  }
  HandlerInfo info;
  info.api_major = static_cast<uint32_t>(metadata.api_version.major_version);
  info.api_minor = static_cast<uint32_t>(metadata.api_version.minor_version);
  info.traits = metadata.traits;
  info.state_type_id = metadata.state_type_id.type_id;
  return info;
}

}  // namespace kreg
