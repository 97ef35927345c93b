// What one call of a handler is given by the executor that runs it: the
// stage, the call site's state, the CUDA stream and device allocator, the
// extensions and the call frame cache (FfiHost::Execute's CallOptions).
#ifndef KREGD_DAEMON_EXECUTOR_FFI_CALL_OPTIONS_H_
#define KREGD_DAEMON_EXECUTOR_FFI_CALL_OPTIONS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {

class CallFrameCache;  // ffi_host.h

// Device memory behind XLA_FFI_DeviceMemory_Allocate/Free on a platform whose
// memory FfiHost does not manage itself (CUDA: the executor's stream-ordered
// allocator, so temporaries are freed only after the kernels using them).
// Implementations must be thread-safe.
class DeviceAllocator {
 public:
  virtual ~DeviceAllocator() = default;
  virtual absl::StatusOr<void*> Allocate(size_t size, size_t alignment) = 0;
  virtual absl::Status Free(void* data, size_t size) = 0;
};

// A per-instance state (XLA FFI's State API) a handler bundle's instantiate
// stage created: the object and its registered type id. Whoever holds one
// destroys it with DestroyState.
struct HostedState {
  void* ptr = nullptr;
  int64_t type_id = 0;
};

// Destroys `state` with the deleter its type was registered with
// (XLA_FFI_Type_Register's XLA_FFI_TypeInfo). False when the type has no
// deleter (the object is leaked).
bool DestroyState(const HostedState& state);

// Platform resources for one Execute, supplied by the executor that owns
// them. Everything is borrowed and must outlive the Execute call.
struct CallOptions {
  // The stage the handler runs at (docs/kernel-author-guide.md, "Handler
  // bundles and state").
  XLA_FFI_ExecutionStage stage = XLA_FFI_ExecutionStage_EXECUTE;
  // What XLA_FFI_State_Get returns (the call site's state; null: none).
  HostedState state;
  // INSTANTIATE: where XLA_FFI_State_Set puts the state the handler made
  // (the caller owns it after the call; it must be empty before).
  HostedState* state_out = nullptr;
  void* stream = nullptr;  // CUDA: the CUstream XLA_FFI_Stream_Get returns
  DeviceAllocator* device_allocator = nullptr;  // CUDA scratch memory
  // Chain searched by XLA_FFI_InvokeContext_FindExtension.
  const XLA_FFI_Extension* extensions = nullptr;
  // Null: the call frame is built for this call alone.
  CallFrameCache* frame_cache = nullptr;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_FFI_CALL_OPTIONS_H_
