// Stream ordering between XLA's stream and kregd's session stream by stream
// memory operations on memory both processes map (the doorbell, DESIGN §3;
// session.proto's CudaDoorbellSetup). Used where kregd and the device
// support it (KREG_CUDA_DOORBELL=0 forces the interprocess events of
// ipc_events.h instead).
#ifndef KREGD_CLIENT_SHIM_CUDA_DOORBELL_H_
#define KREGD_CLIENT_SHIM_CUDA_DOORBELL_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "client/shim/cuda/staging_buffer.h"
#include "common/cuda_driver.h"
#include "common/status.h"
#include "common/unique_fd.h"

namespace kreg::cuda_client {

// One device's doorbell for one session: a cuMemCreate allocation of one
// granule (POSIX-fd exportable, mapped by kregd too) holding two 64-bit
// words, `ready` (written by this process, waited on by kregd) and `done`
// (written by kregd, waited on here). Sequence numbers start at 1 and grow
// by one per launch, so GEQ waits never wrap. Per launch:
//   seq = NextSeq(); Ring(stream, seq); send the launch with seq;
//   if kregd says it signalled: AwaitDone(stream, seq); Finish(stream).
// Calls may come on different XLA streams: Ring first orders a new stream
// after the previous launch's last use (a local event), so `ready` only
// ever grows. Not thread-safe (one per session, whose launches are
// sequential). Needs the device's context current for every call but the
// destructor, which pushes `context` itself.
class Doorbell {
 public:
  static constexpr uint64_t kReadyOffset = 0;
  static constexpr uint64_t kDoneOffset = 128;  // its own cache line

  // FAILED_PRECONDITION when the device lacks 64-bit stream memops
  // (CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS) or VMM/POSIX-fd
  // export (StagingBuffer::Create); UNAVAILABLE without a driver.
  static ClientStatus Create(const cu::CudaDriver* driver, int ordinal,
                             cu::CUcontext context,
                             std::unique_ptr<Doorbell>* out);
  // Waits for the last launch's use (Finish) — after a grace period in
  // which kregd should have written `done`, it writes done :=
  // cu::ReleaseValue(last awaited) itself from a private stream, so XLA's
  // stream can never hang on a vanished kregd — then unmaps.
  ~Doorbell();
  Doorbell(const Doorbell&) = delete;
  Doorbell& operator=(const Doorbell&) = delete;

  // An fd of the allocation for kregd (CudaDoorbellSetup).
  ClientStatus Export(UniqueFd* fd) const;
  uint64_t size() const { return buffer_->size(); }

  uint64_t NextSeq() { return ++seq_; }
  // The last launch's use of the doorbell (Finish) has not passed yet: an
  // XLA stream may still wait for `done` (cuEventQuery; any thread).
  bool Pending() const;
  // cuStreamWriteValue64(ready, seq) on `stream` (after a cross-stream wait
  // when `stream` is not the previous launch's).
  ClientStatus Ring(cu::CUstream stream, uint64_t seq);
  // cuStreamWaitValue64(done, seq, GEQ) on `stream`.
  ClientStatus AwaitDone(cu::CUstream stream, uint64_t seq);
  // Marks the launch's last use of the doorbell on `stream` (every path
  // after Ring).
  ClientStatus Finish(cu::CUstream stream);
  // A forked child: forget every CUDA object without touching it.
  void Leak();

  // The session ended (its executor died or was recycled; kregd closed the
  // session): nothing will write `done` again. Reads `done` (a copy on a
  // private stream of this process's context; no wait on any XLA stream)
  // and, when the last awaited launch's sequence number (AwaitDone) is not
  // there, calls
  // `before_release` (if given: e.g. to record the error the process must
  // see before its stream can move on), then writes done :=
  // cu::ReleaseValue(last awaited) from that stream so that an XLA stream
  // waiting on it proceeds, and returns true: that launch's GPU work never
  // completed, so its outputs were not written. False when every launch
  // completed (or none was made). Only for a session known to have ended: with
  // a live peer it would release a wait early. The doorbell orders nothing
  // after it; destroy it.
  bool Abandon(const std::function<void()>& before_release = {});

  cu::CUdeviceptr ready() const { return buffer_->data() + kReadyOffset; }
  cu::CUdeviceptr done() const { return buffer_->data() + kDoneOffset; }

 private:
  Doorbell(const cu::CudaDriver* driver, cu::CUcontext context)
      : driver_(driver), context_(context) {}

  const cu::CudaDriver* const driver_;
  const cu::CUcontext context_;
  std::unique_ptr<StagingBuffer> buffer_;
  cu::CUevent last_use_ = nullptr;
  bool recorded_ = false;
  cu::CUstream last_stream_ = nullptr;
  uint64_t seq_ = 0;
  uint64_t awaited_ = 0;  // the last seq AwaitDone enqueued a wait for
};

}  // namespace kreg::cuda_client

#endif  // KREGD_CLIENT_SHIM_CUDA_DOORBELL_H_
