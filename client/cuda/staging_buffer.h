// An exportable device buffer for the buffers that cannot be shared
// (ExportKind::kNeedsStaging, e.g. XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async):
// the shim copies such inputs into it and results out of it with
// cuMemcpyDtoDAsync on XLA's stream, and shares it with kregd as a VMM
// allocation like any other.
#ifndef KREGD_CLIENT_CUDA_STAGING_BUFFER_H_
#define KREGD_CLIENT_CUDA_STAGING_BUFFER_H_

#include <cstdint>
#include <memory>

#include "client/cuda/cuda_export.h"
#include "client/cuda/status.h"
#include "daemon/cuda/cuda_driver.h"

namespace kreg::cuda_client {

// Owns a cuMemCreate allocation (POSIX-fd exportable) mapped read-write in
// this process; the destructor unmaps and releases it. The caller must not
// destroy it while queued work uses it. Not thread-safe.
class StagingBuffer {
 public:
  // At least `size` bytes (rounded up to the allocation granularity) on this
  // process's device `ordinal`. RESOURCE_EXHAUSTED when out of memory;
  // FAILED_PRECONDITION without VMM/POSIX-fd support; UNAVAILABLE without a
  // driver.
  static Status Create(const cu::CudaDriver* driver, int ordinal, uint64_t size,
                       std::unique_ptr<StagingBuffer>* out);
  ~StagingBuffer();
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;

  cu::CUdeviceptr data() const { return base_; }
  uint64_t size() const { return size_; }

  // ExportBuffer of the whole buffer (always kVmmFd).
  Status Export(ExportedBuffer* out) const;

 private:
  StagingBuffer(const cu::CudaDriver* driver, uint64_t size)
      : driver_(driver), size_(size) {}

  const cu::CudaDriver* const driver_;
  const uint64_t size_;
  cu::CUmemGenericAllocationHandle handle_ = 0;
  bool created_ = false;
  cu::CUdeviceptr base_ = 0;
  bool mapped_ = false;
};

}  // namespace kreg::cuda_client

#endif  // KREGD_CLIENT_CUDA_STAGING_BUFFER_H_
