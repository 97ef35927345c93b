// Everything one client session holds on kregd's GPUs, and the launch
// sequence around a hosted CUDA handler (DESIGN §3, stream ordering).
#ifndef KREGD_DAEMON_CUDA_CUDA_SESSION_H_
#define KREGD_DAEMON_CUDA_CUDA_SESSION_H_

#include <functional>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "daemon/cuda/cuda_devices.h"
#include "daemon/cuda/cuda_mapping.h"
#include "daemon/cuda/mapping_cache.h"
#include "daemon/cuda/session_streams.h"
#include "daemon/cuda/stream_allocator.h"
#include "daemon/ffi/ffi_host.h"
#include "daemon/unique_fd.h"

namespace kreg {

struct CudaSessionOptions {
  CudaMappingCacheOptions cache;
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
  absl::Status Launch(
      int ordinal, const std::function<absl::Status(const CallOptions&)>& run);

  CudaMappingCache& mappings() { return cache_; }
  SessionStreams& streams() { return streams_; }

 private:
  struct EventPair {
    std::unique_ptr<IpcEventOpen> ready;
    std::unique_ptr<IpcEventOpen> done;
  };

  // The allocator for `ordinal` on `stream`, created on first use.
  StreamOrderedAllocator* AllocatorFor(int ordinal, cu::CUstream stream);

  CudaDevices* const devices_;
  // Declaration order is destruction order, reversed: events and
  // allocators go first, then the mappings (which wait on fences recorded
  // on the streams), then the streams.
  SessionStreams streams_;
  CudaMappingCache cache_;
  absl::Mutex mu_;
  std::map<int, std::unique_ptr<StreamOrderedAllocator>> allocators_
      ABSL_GUARDED_BY(mu_);
  std::map<int, std::shared_ptr<EventPair>> events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kreg

#endif  // KREGD_DAEMON_CUDA_CUDA_SESSION_H_
