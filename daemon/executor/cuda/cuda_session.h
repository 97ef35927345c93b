// Everything one client session holds on kregd's GPUs, and the launch
// sequence around a hosted CUDA handler (DESIGN §3, stream ordering).
#ifndef KREGD_DAEMON_EXECUTOR_CUDA_CUDA_SESSION_H_
#define KREGD_DAEMON_EXECUTOR_CUDA_CUDA_SESSION_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"
#include "daemon/executor/cuda/cuda_devices.h"
#include "daemon/executor/cuda/cuda_mapping.h"
#include "daemon/executor/cuda/mapping_cache.h"
#include "daemon/executor/cuda/session_streams.h"
#include "daemon/executor/cuda/stream_allocator.h"
#include "daemon/executor/ffi/ffi_host.h"

namespace kreg {

struct CudaSessionOptions {
  CudaMappingCacheOptions cache;
  // Session close: how long a doorbell wait still queued may take before
  // kregd releases it itself (CloseDoorbells).
  std::chrono::milliseconds doorbell_grace{5000};
};

// Owns one session's streams (one per device), shared mappings, the client's
// interprocess events and scratch allocators. The destructor (session close)
// waits for the session's GPU work, then releases everything. Thread-safe;
// a session's launches are expected to be sequential. `devices` must outlive
// it.
class CudaSession {
 public:
  explicit CudaSession(CudaDevices* devices, CudaSessionOptions options = {});
  ~CudaSession();
  CudaSession(const CudaSession&) = delete;
  CudaSession& operator=(const CudaSession&) = delete;

  // Imports the client's VMM allocation `key` from `fd` unless this session
  // already has it (then `fd` is just closed). Device by key.device_uuid
  // (CudaDevices::FindByUuid errors); VmmImport::Import errors.
  absl::Status ShareVmm(const CudaMappingKey& key, UniqueFd fd);
  // The same for legacy IPC memory (IpcMemOpen::Open errors).
  absl::Status ShareIpc(const CudaMappingKey& key,
                        const cu::CUipcMemHandle& handle);

  // Opens the client's interprocess event pair for device `device_uuid`,
  // replacing an earlier pair: `ready` is recorded by the client on XLA's
  // stream before a request and waited on here; `done` is recorded here
  // after the handler and waited on by the client after the reply.
  absl::Status SetEvents(absl::string_view device_uuid,
                         const cu::CUipcEventHandle& ready,
                         const cu::CUipcEventHandle& done);

  // Maps the client's doorbell of device `device_uuid` (session.proto's
  // CudaDoorbellSetup): a VMM allocation of `size` bytes from `fd` with two
  // 64-bit words at `ready_offset` and `done_offset`. Zeroes both words on
  // the session stream and waits for that (setup only, never per launch),
  // so no stale value can satisfy a later wait. FAILED_PRECONDITION: the
  // device has no 64-bit stream memops; ALREADY_EXISTS: this session has a
  // doorbell for the device; INVALID_ARGUMENT: bad offsets; VmmImport's and
  // CudaDevices' errors otherwise.
  absl::Status SetDoorbell(absl::string_view device_uuid, UniqueFd fd,
                           uint64_t size, uint64_t ready_offset,
                           uint64_t done_offset);
  bool HasDoorbell(int ordinal);

  // Resolves a buffer of a shared allocation (CudaMappingCache::Resolve).
  absl::StatusOr<CudaMappingCache::Resolved> Resolve(const CudaMappingKey& key,
                                                     uint64_t offset,
                                                     uint64_t length);

  // Runs one handler call on kregd device `ordinal`, without host-side GPU
  // synchronisation: makes the device's context current on this thread, has
  // the session stream wait for the client's `ready` event (when events are
  // set), calls `run` with CallOptions {session stream, stream-ordered
  // allocator}, records `done`, then probes the stream for a sticky error.
  // Returns run's error verbatim, else the first CUDA error (a sticky one
  // marks the device broken). `done` is recorded even if `run` failed, so
  // the client can always wait for it.
  //
  // With `doorbell_seq` > 0 the device's doorbell (SetDoorbell;
  // FAILED_PRECONDITION without one) replaces the events: the stream waits
  // for ready >= doorbell_seq (cuStreamWaitValue64, GEQ) before `run` and
  // writes done := doorbell_seq after it, also when `run` failed.
  // *signalled (if given) says whether that write was enqueued: the client
  // may wait for it only then. Each launch adds at most one pending wait to
  // the stream, and the client has at most ring::kSlots launches in flight
  // (one on the socket, up to kSlots on the launch ring in asynchronous
  // mode), so the queue depth per session stream stays that small (DESIGN
  // §3: deep queues of waits deadlocked in a probe).
  absl::Status Launch(
      int ordinal, const std::function<absl::Status(const CallOptions&)>& run,
      uint64_t doorbell_seq = 0, bool* signalled = nullptr);

  // A doorbell launch that failed before Launch enqueued anything (a bad
  // descriptor, a missing mapping): enqueues done := doorbell_seq on the
  // session stream of `ordinal` without waiting for `ready` (nothing of
  // the launch runs, so nothing needs ordering after the client's work),
  // so that an XLA stream already waiting for it (an asynchronous ring
  // launch) moves on. *signalled says whether the write was enqueued.
  // FAILED_PRECONDITION without a doorbell; CUDA errors as Launch.
  absl::Status SignalDoorbell(int ordinal, uint64_t doorbell_seq,
                              bool* signalled);

  CudaMappingCache& mappings() { return cache_; }

 private:
  struct EventPair {
    std::unique_ptr<IpcEventOpen> ready;
    std::unique_ptr<IpcEventOpen> done;
  };
  struct Doorbell {
    std::unique_ptr<VmmImport> mapping;
    cu::CUdeviceptr ready = 0;  // kregd's addresses of the two words
    cu::CUdeviceptr done = 0;
    // The last sequence number a session stream waits for on `ready`.
    std::atomic<uint64_t> last_seq{0};
  };

  // Session close: lets every doorbell wait still queued on a session stream
  // finish (the client's ready write may never come if it died: after a
  // grace period kregd writes ready := cu::ReleaseValue(last_seq) itself
  // from a private
  // stream), then unmaps the doorbells.
  void CloseDoorbells();

  // The doorbell of `ordinal`; FAILED_PRECONDITION (naming the launch's
  // `doorbell_seq`) when the session set up none.
  absl::StatusOr<std::shared_ptr<Doorbell>> DoorbellOf(int ordinal,
                                                       uint64_t doorbell_seq);
  // Enqueues done := doorbell_seq on `stream`; `*signalled` (if given) is
  // set when it was.
  absl::Status WriteDone(int ordinal, cu::CUstream stream, const Doorbell& bell,
                         uint64_t doorbell_seq, bool* signalled);

  // The allocator for `ordinal` on `stream`, created on first use.
  StreamOrderedAllocator* AllocatorFor(int ordinal, cu::CUstream stream);

  CudaDevices* const devices_;
  const std::chrono::milliseconds doorbell_grace_;
  // Declaration order is destruction order, reversed: events and
  // allocators go first, then the mappings (which wait on fences recorded
  // on the streams), then the streams.
  SessionStreams streams_;
  CudaMappingCache cache_;
  absl::Mutex mu_;
  std::map<int, std::unique_ptr<StreamOrderedAllocator>> allocators_
      ABSL_GUARDED_BY(mu_);
  std::map<int, std::shared_ptr<EventPair>> events_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::shared_ptr<Doorbell>> doorbells_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_CUDA_CUDA_SESSION_H_
