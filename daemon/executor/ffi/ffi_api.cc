// kregd's implementation of the XLA FFI API functions and its XLA_FFI_Api
// table. Every function checks its args struct (non-null, struct_size at
// least this build's, as XLA does: ffi.h passes a larger size to RunId_Get)
// and its context, and fails with an FFI error naming itself, never a crash.
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "daemon/base/platform_table.h"
#include "daemon/executor/ffi/ffi_host.h"
#include "daemon/executor/ffi/ffi_internal.h"
#include "daemon/executor/ffi/thread_pool.h"
#include "daemon/executor/ffi/type_registry.h"

namespace kreg {
namespace {

using ffi_internal::NewError;

// Non-null error if `args` is null or smaller than this build's struct.
template <typename Args>
XLA_FFI_Error* CheckArgs(absl::string_view fn, const Args* args,
                         size_t expected) {
  if (args == nullptr) {
    return NewError(XLA_FFI_Error_Code_INVALID_ARGUMENT,
                    absl::StrCat(fn, ": args is null"));
  }
  if (args->struct_size < expected) {
    return NewError(
        XLA_FFI_Error_Code_INVALID_ARGUMENT,
        absl::StrCat(fn, ": args struct_size is ", args->struct_size,
                     ", expected at least ", expected, " (kregd hosts XLA FFI ",
                     "API ", kHostedApiMajor, ".", kHostedApiMinor,
                     "); check installed software versions"));
  }
  return nullptr;
}

// Non-null error unless `ctx` is the context of a live kregd call.
XLA_FFI_Error* CheckCtx(absl::string_view fn, XLA_FFI_InvokeContext* ctx) {
  if (ctx == nullptr) {
    return NewError(XLA_FFI_Error_Code_INVALID_ARGUMENT,
                    absl::StrCat(fn, ": no execution context (ctx is null)"));
  }
  if (ctx->magic.load() != XLA_FFI_InvokeContext::kLive) {
    return NewError(XLA_FFI_Error_Code_INVALID_ARGUMENT,
                    absl::StrCat(fn,
                                 ": ctx is not the execution context of a "
                                 "running kregd call (has the call "
                                 "ended?)"));
  }
  return nullptr;
}

#define KREG_FFI_CHECK(fn, args, struct_type)               \
  if (XLA_FFI_Error* kreg_err =                             \
          CheckArgs(fn, args, struct_type##_STRUCT_SIZE)) { \
    return kreg_err;                                        \
  }
#define KREG_FFI_CHECK_CTX(fn, args, struct_type) \
  KREG_FFI_CHECK(fn, args, struct_type)           \
  if (XLA_FFI_Error* kreg_err = CheckCtx(fn, (args)->ctx)) return kreg_err;

//===--- Errors ----------------------------------------------------------===//

XLA_FFI_Error* ErrorCreate(XLA_FFI_Error_Create_Args* args) {
  KREG_FFI_CHECK("XLA_FFI_Error_Create", args, XLA_FFI_Error_Create_Args);
  return NewError(args->errc, args->message != nullptr ? args->message : "");
}

void ErrorGetDetails(XLA_FFI_Error_GetDetails_Args* args) {
  if (XLA_FFI_Error* err =
          CheckArgs("XLA_FFI_Error_GetDetails", args,
                    XLA_FFI_Error_GetDetails_Args_STRUCT_SIZE)) {
    spdlog::error("{}", err->message);  // cannot be reported to the caller
    delete err;
    return;
  }
  if (args->error == nullptr) {
    args->message = "XLA_FFI_Error_GetDetails: error is null";
    args->errc = XLA_FFI_Error_Code_INVALID_ARGUMENT;
    return;
  }
  args->message = args->error->message.c_str();
  args->errc = args->error->errc;
}

void ErrorDestroy(XLA_FFI_Error_Destroy_Args* args) {
  if (XLA_FFI_Error* err = CheckArgs("XLA_FFI_Error_Destroy", args,
                                     XLA_FFI_Error_Destroy_Args_STRUCT_SIZE)) {
    spdlog::error("{}", err->message);
    delete err;
    return;
  }
  delete args->error;
}

//===--- Registration ----------------------------------------------------===//

XLA_FFI_Error* HandlerRegister(XLA_FFI_Handler_Register_Args* args) {
  KREG_FFI_CHECK("XLA_FFI_Handler_Register", args,
                 XLA_FFI_Handler_Register_Args);
  absl::string_view name(args->name.ptr, args->name.ptr ? args->name.len : 0);
  return NewError(
      XLA_FFI_Error_Code_UNIMPLEMENTED,
      absl::StrCat("XLA_FFI_Handler_Register: kregd does not register "
                   "handlers through the XLA FFI API (handler \"",
                   name,
                   "\" ignored); register targets with kregd "
                   "(kreg.register_ffi_target or kregctl register)"));
}

XLA_FFI_Error* TypeRegister(XLA_FFI_Type_Register_Args* args) {
  KREG_FFI_CHECK("XLA_FFI_Type_Register", args, XLA_FFI_Type_Register_Args);
  absl::string_view name(args->name.ptr, args->name.ptr ? args->name.len : 0);
  absl::Status status = ffi_internal::TypeRegistry::Global().Register(
      name, args->type_id, args->type_info);
  if (status.ok()) return nullptr;
  return NewError(static_cast<XLA_FFI_Error_Code>(status.code()),
                  absl::StrCat("XLA_FFI_Type_Register: ", status.message()));
}

//===--- Context ---------------------------------------------------------===//

const char* PrepareOrInitialize(XLA_FFI_ExecutionStage stage) {
  return stage == XLA_FFI_ExecutionStage_PREPARE ? "prepare" : "initialize";
}

XLA_FFI_Error* StreamGet(XLA_FFI_Stream_Get_Args* args) {
  KREG_FFI_CHECK_CTX("XLA_FFI_Stream_Get", args, XLA_FFI_Stream_Get_Args);
  if (!TraitsOf(args->ctx->platform).ffi_stream) {
    return NewError(XLA_FFI_Error_Code_UNIMPLEMENTED,
                    absl::StrCat("XLA_FFI_Stream_Get: streams are a GPU "
                                 "concept; this call runs on the ",
                                 PlatformName(args->ctx->platform),
                                 " platform, which has no stream (as in "
                                 "XLA:CPU)"));
  }
  if (args->ctx->options.stream == nullptr) {
    const XLA_FFI_ExecutionStage stage = args->ctx->options.stage;
    if (stage == XLA_FFI_ExecutionStage_PREPARE ||
        stage == XLA_FFI_ExecutionStage_INITIALIZE) {
      // docs/kernel-author-guide.md, "Handler bundles and state".
      return NewError(
          XLA_FFI_Error_Code_UNIMPLEMENTED,
          absl::StrCat("XLA_FFI_Stream_Get: kregd's isolated mode runs a "
                       "bundle's ",
                       PrepareOrInitialize(stage),
                       " stage without a stream; queue GPU work in the "
                       "execute stage, or bind the target with "
                       "execution=\"local\""));
    }
    return NewError(XLA_FFI_Error_Code_UNIMPLEMENTED,
                    "XLA_FFI_Stream_Get: no stream is available for this "
                    "call");
  }
  args->stream = args->ctx->options.stream;
  return nullptr;
}

XLA_FFI_Error* InvokeContextGet(XLA_FFI_InvokeContext_Get_Args* args) {
  KREG_FFI_CHECK_CTX("XLA_FFI_InvokeContext_Get", args,
                     XLA_FFI_InvokeContext_Get_Args);
  int64_t id = args->type_id != nullptr ? args->type_id->type_id : 0;
  return NewError(
      XLA_FFI_Error_Code_UNIMPLEMENTED,
      absl::StrCat("XLA_FFI_InvokeContext_Get: execution-context user data "
                   "(type id ",
                   id,
                   ") is not supported by kregd: it lives in the JAX "
                   "process, not in the daemon"));
}

// The refusal of a per-execution state (ffi::Prepared<T> /
// ffi::Initialized<T>: State_Set or State_Get at the PREPARE or INITIALIZE
// stage); a state offered to State_Set (`offered`, may be null) is
// destroyed, as its ownership was transferred.
std::string PerExecutionStateRefusal(absl::string_view fn,
                                     XLA_FFI_ExecutionStage stage,
                                     const kreg::HostedState* offered) {
  if (offered != nullptr) kreg::DestroyState(*offered);
  return absl::StrCat(
      fn, ": per-execution states (the ", PrepareOrInitialize(stage),
      " stage's, ffi::",
      stage == XLA_FFI_ExecutionStage_PREPARE ? "Prepared" : "Initialized",
      "<T>) are not kept by kregd's isolated mode; keep what the stage makes "
      "in the call site's state (ffi::State<T>, made at instantiate), or "
      "bind the target with execution=\"local\"");
}

// State_Set: only an INSTANTIATE call may set the call site's state, once.
XLA_FFI_Error* StateSet(XLA_FFI_State_Set_Args* args) {
  KREG_FFI_CHECK_CTX("XLA_FFI_State_Set", args, XLA_FFI_State_Set_Args);
  kreg::HostedState state{
      args->state, args->type_id != nullptr ? args->type_id->type_id : 0};
  kreg::HostedState* out = args->ctx->options.state_out;
  std::string refusal;
  if (args->type_id == nullptr || state.type_id == 0) {
    refusal =
        "the state's type is not registered (type id 0); name the "
        "bundle's state type when registering the target";
  } else if (args->stage == XLA_FFI_ExecutionStage_PREPARE ||
             args->stage == XLA_FFI_ExecutionStage_INITIALIZE) {
    // Per-execution states (ffi::Prepared<T>, ffi::Initialized<T>) are not
    // kept across the process boundary (docs/kernel-author-guide.md,
    // "Handler bundles and state").
    return NewError(
        XLA_FFI_Error_Code_UNIMPLEMENTED,
        PerExecutionStateRefusal("XLA_FFI_State_Set", args->stage, &state));
  } else if (args->stage != XLA_FFI_ExecutionStage_INSTANTIATE) {
    refusal = absl::StrCat(
        "a state can only be set at the instantiate stage "
        "(this is stage ",
        static_cast<int>(args->stage), ")");
  } else if (out == nullptr) {
    refusal =
        "this call keeps no state (it was not run as a bundle's "
        "instantiate stage)";
  } else if (out->ptr != nullptr) {
    refusal = "this call site's state was already set";
  }
  if (refusal.empty()) {
    *out = state;
    return nullptr;
  }
  // Ownership of `state` was transferred to us: destroy it if we can.
  kreg::DestroyState(state);
  return NewError(XLA_FFI_Error_Code_FAILED_PRECONDITION,
                  absl::StrCat("XLA_FFI_State_Set: ", refusal));
}

XLA_FFI_Error* StateGet(XLA_FFI_State_Get_Args* args) {
  KREG_FFI_CHECK_CTX("XLA_FFI_State_Get", args, XLA_FFI_State_Get_Args);
  if (args->stage == XLA_FFI_ExecutionStage_PREPARE ||
      args->stage == XLA_FFI_ExecutionStage_INITIALIZE) {
    return NewError(
        XLA_FFI_Error_Code_UNIMPLEMENTED,
        PerExecutionStateRefusal("XLA_FFI_State_Get", args->stage, nullptr));
  }
  const kreg::HostedState& state = args->ctx->options.state;
  const int64_t want = args->type_id != nullptr ? args->type_id->type_id : 0;
  if (state.ptr == nullptr) {
    return NewError(
        XLA_FFI_Error_Code_FAILED_PRECONDITION,
        "XLA_FFI_State_Get: this call site has no state: register the "
        "target as a handler bundle with an instantiate stage that creates "
        "one (docs/kernel-author-guide.md, \"Handler bundles and state\")");
  }
  if (want != state.type_id) {
    return NewError(
        XLA_FFI_Error_Code_INVALID_ARGUMENT,
        absl::StrCat("XLA_FFI_State_Get: the state has type id ", state.type_id,
                     ", the handler asked for ", want));
  }
  args->state = state.ptr;
  return nullptr;
}

XLA_FFI_Error* RunIdGet(XLA_FFI_RunId_Get_Args* args) {
  KREG_FFI_CHECK_CTX("XLA_FFI_RunId_Get", args, XLA_FFI_RunId_Get_Args);
  args->run_id = args->ctx->run_id;
  return nullptr;
}

XLA_FFI_Error* DeviceOrdinalGet(XLA_FFI_DeviceOrdinal_Get_Args* args) {
  KREG_FFI_CHECK_CTX("XLA_FFI_DeviceOrdinal_Get", args,
                     XLA_FFI_DeviceOrdinal_Get_Args);
  args->device_ordinal = args->ctx->device_ordinal;
  return nullptr;
}

XLA_FFI_Error* FindExtension(XLA_FFI_InvokeContext_FindExtension_Args* args) {
  KREG_FFI_CHECK_CTX("XLA_FFI_InvokeContext_FindExtension", args,
                     XLA_FFI_InvokeContext_FindExtension_Args);
  args->extension = nullptr;  // not found: ffi.h reports it by name
  for (const XLA_FFI_Extension* ext = args->ctx->options.extensions;
       ext != nullptr; ext = ext->next) {
    if (ext->id.extension_type == args->extension_type) {
      args->extension = ext;
      break;
    }
  }
  return nullptr;
}

//===--- Scratch memory --------------------------------------------------===//

XLA_FFI_Error* DeviceMemoryAllocate(XLA_FFI_DeviceMemory_Allocate_Args* args) {
  constexpr absl::string_view kFn = "XLA_FFI_DeviceMemory_Allocate";
  KREG_FFI_CHECK_CTX(kFn, args, XLA_FFI_DeviceMemory_Allocate_Args);
  XLA_FFI_InvokeContext* ctx = args->ctx;
  size_t alignment = args->alignment;
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return NewError(
        XLA_FFI_Error_Code_INVALID_ARGUMENT,
        absl::StrCat(kFn, ": alignment ", alignment, " is not a power of two"));
  }
  void* data = nullptr;
  if (TraitsOf(ctx->platform).memory == PlatformMemory::kHost) {
    size_t size = args->size > 0 ? args->size : 1;
    if (alignment < sizeof(void*)) alignment = sizeof(void*);
    if (posix_memalign(&data, alignment, size) != 0) {
      return NewError(XLA_FFI_Error_Code_RESOURCE_EXHAUSTED,
                      absl::StrCat(kFn, ": cannot allocate ", args->size,
                                   " bytes of scratch memory (alignment ",
                                   args->alignment, ")"));
    }
  } else {
    if (ctx->options.device_allocator == nullptr) {
      return NewError(XLA_FFI_Error_Code_UNIMPLEMENTED,
                      absl::StrCat(kFn,
                                   ": no device memory allocator is "
                                   "available for this call"));
    }
    absl::StatusOr<void*> allocated =
        ctx->options.device_allocator->Allocate(args->size, alignment);
    if (!allocated.ok()) {
      return NewError(
          static_cast<XLA_FFI_Error_Code>(allocated.status().code()),
          absl::StrCat(kFn, ": ", allocated.status().message()));
    }
    data = *allocated;
  }
  {
    absl::MutexLock lock(&ctx->mu);
    ctx->scratch[data] = args->size;
  }
  ctx->scratch_gauge->fetch_add(static_cast<int64_t>(args->size));
  args->data = data;
  return nullptr;
}

XLA_FFI_Error* DeviceMemoryFree(XLA_FFI_DeviceMemory_Free_Args* args) {
  constexpr absl::string_view kFn = "XLA_FFI_DeviceMemory_Free";
  KREG_FFI_CHECK_CTX(kFn, args, XLA_FFI_DeviceMemory_Free_Args);
  XLA_FFI_InvokeContext* ctx = args->ctx;
  size_t size;
  {
    absl::MutexLock lock(&ctx->mu);
    auto it = ctx->scratch.find(args->data);
    if (it == ctx->scratch.end()) {
      return NewError(
          XLA_FFI_Error_Code_INVALID_ARGUMENT,
          absl::StrFormat("%s: %p was not allocated by "
                          "XLA_FFI_DeviceMemory_Allocate in this call, or was "
                          "freed already",
                          kFn, args->data));
    }
    size = it->second;
    ctx->scratch.erase(it);
  }
  ctx->scratch_gauge->fetch_sub(static_cast<int64_t>(size));
  if (TraitsOf(ctx->platform).memory == PlatformMemory::kHost) {
    std::free(args->data);
    return nullptr;
  }
  absl::Status status = ctx->options.device_allocator->Free(args->data, size);
  if (status.ok()) return nullptr;
  return NewError(static_cast<XLA_FFI_Error_Code>(status.code()),
                  absl::StrCat(kFn, ": ", status.message()));
}

//===--- Thread pool -----------------------------------------------------===//

XLA_FFI_Error* CheckCpuPool(absl::string_view fn, XLA_FFI_InvokeContext* ctx) {
  if (!TraitsOf(ctx->platform).ffi_thread_pool) {
    return NewError(
        XLA_FFI_Error_Code_UNIMPLEMENTED,
        absl::StrCat(fn, ": no thread pool on the ",
                     PlatformName(ctx->platform), " platform (as in XLA:GPU)"));
  }
  return nullptr;
}

XLA_FFI_Error* ThreadPoolSchedule(XLA_FFI_ThreadPool_Schedule_Args* args) {
  constexpr absl::string_view kFn = "XLA_FFI_ThreadPool_Schedule";
  KREG_FFI_CHECK_CTX(kFn, args, XLA_FFI_ThreadPool_Schedule_Args);
  if (XLA_FFI_Error* err = CheckCpuPool(kFn, args->ctx)) return err;
  if (args->task == nullptr) {
    return NewError(XLA_FFI_Error_Code_INVALID_ARGUMENT,
                    absl::StrCat(kFn, ": task is null"));
  }
  XLA_FFI_Task* task = args->task;
  void* data = args->data;
  if (!args->ctx->pool->Schedule([task, data] { task(data); })) {
    return NewError(XLA_FFI_Error_Code_UNAVAILABLE,
                    absl::StrCat(kFn, ": the thread pool is shutting down"));
  }
  return nullptr;
}

XLA_FFI_Error* ThreadPoolNumThreads(XLA_FFI_ThreadPool_NumThreads_Args* args) {
  constexpr absl::string_view kFn = "XLA_FFI_ThreadPool_NumThreads";
  KREG_FFI_CHECK_CTX(kFn, args, XLA_FFI_ThreadPool_NumThreads_Args);
  if (XLA_FFI_Error* err = CheckCpuPool(kFn, args->ctx)) return err;
  if (args->num_threads == nullptr) {
    return NewError(XLA_FFI_Error_Code_INVALID_ARGUMENT,
                    absl::StrCat(kFn, ": num_threads is null"));
  }
  *args->num_threads = args->ctx->pool->num_threads();
  return nullptr;
}

//===--- Futures ---------------------------------------------------------===//

XLA_FFI_Error* FutureCreate(XLA_FFI_Future_Create_Args* args) {
  KREG_FFI_CHECK("XLA_FFI_Future_Create", args, XLA_FFI_Future_Create_Args);
  auto* future = new XLA_FFI_Future();
  // The call running on this thread holds kregd's reference; a future made
  // elsewhere gets its holder when a handler returns it.
  if (XLA_FFI_InvokeContext* call = ffi_internal::CurrentCall()) {
    call->AdoptFuture(future);
  }
  args->future = future;
  return nullptr;
}

XLA_FFI_Error* FutureSetAvailable(XLA_FFI_Future_SetAvailable_Args* args) {
  KREG_FFI_CHECK("XLA_FFI_Future_SetAvailable", args,
                 XLA_FFI_Future_SetAvailable_Args);
  return ffi_internal::CompleteFuture("XLA_FFI_Future_SetAvailable",
                                      args->future, nullptr);
}

XLA_FFI_Error* FutureSetError(XLA_FFI_Future_SetError_Args* args) {
  constexpr absl::string_view kFn = "XLA_FFI_Future_SetError";
  KREG_FFI_CHECK(kFn, args, XLA_FFI_Future_SetError_Args);
  XLA_FFI_Error* error = args->error;
  if (error == nullptr || error->errc == XLA_FFI_Error_Code_OK) {
    // Still complete the future (with an error) so nobody waits forever;
    // ffi.h aborts the process on an error from this function.
    delete error;
    error = NewError(XLA_FFI_Error_Code_INTERNAL,
                     absl::StrCat(kFn,
                                  ": the handler completed its future "
                                  "with a null or OK error"));
  }
  return ffi_internal::CompleteFuture(kFn, args->future, error);
}

#undef KREG_FFI_CHECK_CTX
#undef KREG_FFI_CHECK

const XLA_FFI_Api kApi = {
    XLA_FFI_Api_STRUCT_SIZE,
    /*extension_start=*/nullptr,
    XLA_FFI_Api_Version{XLA_FFI_Api_Version_STRUCT_SIZE,
                        /*extension_start=*/nullptr, XLA_FFI_API_MAJOR,
                        XLA_FFI_API_MINOR},
    /*internal_api=*/nullptr,
    ErrorCreate,
    ErrorGetDetails,
    ErrorDestroy,
    HandlerRegister,
    StreamGet,
    TypeRegister,
    InvokeContextGet,
    StateSet,
    StateGet,
    DeviceMemoryAllocate,
    DeviceMemoryFree,
    ThreadPoolSchedule,
    ThreadPoolNumThreads,
    FutureCreate,
    FutureSetAvailable,
    FutureSetError,
    RunIdGet,
    DeviceOrdinalGet,
    FindExtension,
};

// A new field in XLA_FFI_Api means a new function kregd must implement.
static_assert(sizeof(XLA_FFI_Api) == XLA_FFI_Api_STRUCT_SIZE,
              "XLA_FFI_Api grew: implement the new functions");

}  // namespace

const XLA_FFI_Api* HostedApi() { return &kApi; }

}  // namespace kreg
