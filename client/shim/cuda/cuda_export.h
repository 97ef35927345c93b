// The client side of CUDA buffer sharing (DESIGN §3): what the forwarding
// shim calls, inside the JAX process, to hand XLA's device buffers and stream
// ordering to kregd. libc + the dlopen'ed driver only (no absl, gRPC or
// protobuf); every function takes the driver table explicitly (null: no
// driver), so tests run it over a fake.
#ifndef KREGD_CLIENT_SHIM_CUDA_CUDA_EXPORT_H_
#define KREGD_CLIENT_SHIM_CUDA_CUDA_EXPORT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "common/cuda_driver.h"
#include "common/status.h"
#include "common/unique_fd.h"

namespace kreg::cuda_client {

// The process's driver table (cu::LoadCudaDriver), or null with *status
// UNAVAILABLE "no CUDA driver: ...".
const cu::CudaDriver* ProcessDriver(ClientStatus* status);

// Pushes `ctx` (if any) for the scope; pops it at the end if the push
// succeeded.
class PushContext {
 public:
  // Pushes nothing when `ctx` is already current (XLA calls handlers with
  // its context current): one driver call instead of two.
  PushContext(const cu::CudaDriver& d, cu::CUcontext ctx) : d_(d) {
    if (ctx == nullptr) return;
    cu::CUcontext current = nullptr;
    if (d_.cuCtxGetCurrent(&current) == cu::CUDA_SUCCESS && current == ctx) {
      return;
    }
    pushed_ = d_.cuCtxPushCurrent(ctx) == cu::CUDA_SUCCESS;
  }
  ~PushContext() {
    if (pushed_) {
      cu::CUcontext popped;
      d_.cuCtxPopCurrent(&popped);
    }
  }
  PushContext(const PushContext&) = delete;
  PushContext& operator=(const PushContext&) = delete;

 private:
  const cu::CudaDriver& d_;
  bool pushed_ = false;
};

// The allocation behind a device pointer: what kregd's mapping cache is keyed
// by (CudaMappingKey).
struct AllocationId {
  std::string device_uuid;  // 16 raw bytes (cuDeviceGetUuid)
  int device_ordinal = -1;  // this process's ordinal of the device
  uint64_t base = 0;        // start of the mapping holding the pointer
  uint64_t size = 0;        // its size
  // CU_POINTER_ATTRIBUTE_BUFFER_ID: unique in this process for the life of
  // the allocation, so a reused address gets a new one. 0 when the driver
  // gives none (then the mapping must not be reused from a cache).
  uint64_t generation = 0;
};

// Identifies the allocation holding `ptr` with one cuPointerGetAttributes
// call (cheap: meant for every buffer of every launch). INVALID_ARGUMENT if
// `ptr` is not device memory; UNAVAILABLE without a driver.
ClientStatus IdentifyBuffer(const cu::CudaDriver* driver, const void* ptr,
                            AllocationId* out, uint64_t* offset = nullptr);

// Keeps a VMM allocation alive (a retained handle, cuMemRelease'd on
// destruction): held for as long as kregd may map the allocation, so its
// physical memory is never reused under kregd's mapping.
class RetainedAllocation {
 public:
  RetainedAllocation() = default;
  RetainedAllocation(const cu::CudaDriver* driver,
                     cu::CUmemGenericAllocationHandle handle)
      : driver_(driver), handle_(handle) {}
  RetainedAllocation(RetainedAllocation&& o) noexcept;
  RetainedAllocation& operator=(RetainedAllocation&& o) noexcept;
  RetainedAllocation(const RetainedAllocation&) = delete;
  RetainedAllocation& operator=(const RetainedAllocation&) = delete;
  ~RetainedAllocation() { Reset(); }

  bool held() const { return driver_ != nullptr; }
  void Reset();

 private:
  const cu::CudaDriver* driver_ = nullptr;
  cu::CUmemGenericAllocationHandle handle_ = 0;
};

enum class ExportKind {
  kVmmFd,         // fd from cuMemExportToShareableHandle (POSIX fd)
  kLegacyIpc,     // ipc_handle from cuIpcGetMemHandle (cudaMalloc memory)
  kNeedsStaging,  // neither: copy through an exportable staging buffer
};

// How kregd can reach one device buffer.
struct ExportedBuffer {
  ExportKind kind = ExportKind::kNeedsStaging;
  AllocationId id;
  uint64_t offset = 0;              // ptr - id.base
  UniqueFd fd;                      // kVmmFd: send with SCM_RIGHTS, then close
  cu::CUipcMemHandle ipc_handle{};  // kLegacyIpc
  RetainedAllocation retained;      // kVmmFd: keep while kregd maps it
  std::string staging_reason;       // kNeedsStaging: why neither worked
};

// Exports the allocation holding `ptr`: VMM first (cuMemRetainAllocationHandle
// + cuMemExportToShareableHandle, POSIX fd), else legacy IPC
// (cuIpcGetMemHandle of the allocation base, in the pointer's context), else
// kNeedsStaging with the reasons. Only IdentifyBuffer's failures are errors.
ClientStatus ExportBuffer(const cu::CudaDriver* driver, const void* ptr,
                          ExportedBuffer* out);

// The UUID (16 raw bytes) of this process's device `ordinal`.
ClientStatus DeviceUuid(const cu::CudaDriver* driver, int ordinal,
                        std::string* uuid);

// The context, device ordinal and UUID of `stream` (XLA's stream). The
// device of a context is remembered per thread, by the driver's context ID
// (cuCtxGetId; every call asks the driver where it lacks one).
ClientStatus StreamDevice(const cu::CudaDriver* driver, cu::CUstream stream,
                          cu::CUcontext* context, int* ordinal,
                          std::string* uuid);

}  // namespace kreg::cuda_client

#endif  // KREGD_CLIENT_SHIM_CUDA_CUDA_EXPORT_H_
