// Stream-ordered scratch memory for hosted CUDA handlers.
#ifndef KREGD_DAEMON_EXECUTOR_CUDA_STREAM_ALLOCATOR_H_
#define KREGD_DAEMON_EXECUTOR_CUDA_STREAM_ALLOCATOR_H_

#include <cstddef>
#include <map>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/executor/cuda/cuda_devices.h"
#include "daemon/executor/ffi/ffi_host.h"

namespace kreg {

// FfiHost's DeviceAllocator on CUDA (XLA_FFI_DeviceMemory_Allocate/Free):
// memory from the device's default memory pool, allocated and freed in order
// on one session stream (cuMemAllocAsync / cuMemFreeAsync). A free is queued
// behind the kernels that use the memory, so scratch can never be reused
// while they run — the hazard of freeing device temporaries on the host
// cannot happen. Thread-safe. `devices` and `stream` must outlive it.
class StreamOrderedAllocator final : public DeviceAllocator {
 public:
  StreamOrderedAllocator(CudaDevices* devices, int ordinal,
                         cu::CUstream stream);
  // Frees (stream-ordered) whatever is still allocated.
  ~StreamOrderedAllocator() override;

  // `size` bytes aligned to `alignment` (a power of two; the pool's own
  // alignment is at least 256 bytes, larger ones over-allocate). Size 0 is
  // null. INVALID_ARGUMENT for a bad alignment; RESOURCE_EXHAUSTED when the
  // pool is out of memory; FAILED_PRECONDITION on a device without memory
  // pools; CudaDevices::Check's errors.
  absl::StatusOr<void*> Allocate(size_t size, size_t alignment) override;
  // Queues the free of `data` (from Allocate) on the stream. Null is a no-op;
  // INVALID_ARGUMENT for a pointer this allocator did not hand out.
  absl::Status Free(void* data, size_t size) override;

  size_t live_allocations() const;

 private:
  absl::Status FreeRaw(cu::CUdeviceptr raw);

  CudaDevices* const devices_;
  const int ordinal_;
  const cu::CUstream stream_;
  mutable absl::Mutex mu_;
  // Handed-out address -> the pool allocation behind it.
  std::map<void*, cu::CUdeviceptr> live_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_CUDA_STREAM_ALLOCATOR_H_
