// An exportable device buffer for the buffers that cannot be shared
// (ExportKind::kNeedsStaging, e.g. XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async):
// the shim copies such inputs into it and results out of it with
// cuMemcpyDtoDAsync on XLA's stream, and shares it with kregd as a VMM
// allocation like any other.
#ifndef KREGD_CLIENT_SHIM_CUDA_STAGING_BUFFER_H_
#define KREGD_CLIENT_SHIM_CUDA_STAGING_BUFFER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "client/shim/cuda/cuda_export.h"
#include "common/cuda_driver.h"
#include "common/status.h"

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
  static ClientStatus Create(const cu::CudaDriver* driver, int ordinal,
                             uint64_t size,
                             std::unique_ptr<StagingBuffer>* out);
  ~StagingBuffer();
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;

  cu::CUdeviceptr data() const { return base_; }
  uint64_t size() const { return size_; }

  // ExportBuffer of the whole buffer (always kVmmFd).
  ClientStatus Export(ExportedBuffer* out) const;

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

// Where the staged buffers of one call lie in the staging buffer.
struct StagedBuffer {
  const void* data = nullptr;  // the buffer XLA gave (not shareable)
  uint64_t bytes = 0;          // 0: nothing staged, nothing copied
  bool is_input = false;
};
struct StagingLayout {
  std::vector<uint64_t> offsets;  // per buffer, into the staging buffer
  std::vector<bool> copy_in;      // inputs: the first of identical buffers
  std::vector<bool> copy_out;     // outputs: the first of identical buffers
  uint64_t bytes = 0;             // what the staging buffer must hold
};

// One `align`-aligned region per distinct (data, bytes) pair: an aliased
// input/output pair, or the same buffer passed twice, shares one region
// (holding the input's values; copied back once). Zero-size buffers get no
// region and no copy. INVALID_ARGUMENT if the sizes overflow.
ClientStatus LayoutStaging(const std::vector<StagedBuffer>& buffers,
                           uint64_t align, StagingLayout* out);

// The staging buffer of one device for one session, reused across calls and
// grown by doubling. Stream-ordered throughout, never a host wait on the
// call path:
//   - every call's last use is marked by an event recorded on its stream
//     (Release); a call on another stream first waits for that event, so
//     two calls never race on the buffer;
//   - a buffer outgrown is retired, not freed: it is unmapped once its last
//     use event has completed (polled by Acquire/Reap), or in the destructor
//     after waiting for it.
// Not thread-safe (one per session, whose calls are sequential). Needs the
// device's context current (the caller's) for every call but the
// destructor, which pushes `context` itself.
class StagingArena {
 public:
  StagingArena(const cu::CudaDriver* driver, int ordinal, cu::CUcontext context)
      : driver_(driver), ordinal_(ordinal), context_(context) {}
  ~StagingArena();
  StagingArena(const StagingArena&) = delete;
  StagingArena& operator=(const StagingArena&) = delete;

  // Makes the buffer at least `bytes` long (`bytes` > 0) and orders
  // `stream` after its previous use. *retired (if not null) is set to the id
  // of a buffer this call replaced (kregd should drop its mapping), else its
  // size is left 0.
  ClientStatus Acquire(cu::CUstream stream, uint64_t bytes,
                       AllocationId* retired);
  // Marks the end of a call's use of the buffer on `stream` (after its last
  // copy out, or after the call failed). Safe to call more than once.
  ClientStatus Release(cu::CUstream stream);
  // Frees retired buffers whose last use has completed. Non-blocking.
  void Reap();
  // A forked child: forget every CUDA object without touching it.
  void Leak();

  const StagingBuffer* buffer() const { return current_.buffer.get(); }
  // IdentifyBuffer of buffer()'s base (what kregd's cache is keyed by).
  const AllocationId& id() const { return current_.id; }
  size_t retired_count() const { return retired_.size(); }

 private:
  struct Slot {
    std::unique_ptr<StagingBuffer> buffer;
    AllocationId id;
    cu::CUevent last_use = nullptr;  // recorded by Release
    bool recorded = false;
    bool record_failed = false;  // then wait for the whole stream
    cu::CUstream last_stream = nullptr;
  };
  // Waits (host) for `s`'s last use; false if that could not be confirmed.
  bool WaitIdle(Slot* s);
  void Free(Slot* s);

  const cu::CudaDriver* const driver_;
  const int ordinal_;
  const cu::CUcontext context_;
  Slot current_;
  std::vector<Slot> retired_;
};

}  // namespace kreg::cuda_client

#endif  // KREGD_CLIENT_SHIM_CUDA_STAGING_BUFFER_H_
