// The CUDA streams of one client session.
#ifndef KREGD_DAEMON_EXECUTOR_CUDA_SESSION_STREAMS_H_
#define KREGD_DAEMON_EXECUTOR_CUDA_SESSION_STREAMS_H_

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/executor/cuda/cuda_devices.h"
#include "daemon/executor/cuda/fence.h"

namespace kreg {

// Owns one non-blocking stream per device for one session, created on first
// use in the device's primary context. A FenceSource: a fence is an event
// recorded on the device's stream. The destructor waits for each stream's
// work (session close, not the launch path) and destroys it. Thread-safe.
// `devices` must outlive it.
class SessionStreams final : public FenceSource {
 public:
  explicit SessionStreams(CudaDevices* devices);
  ~SessionStreams() override;
  SessionStreams(const SessionStreams&) = delete;
  SessionStreams& operator=(const SessionStreams&) = delete;

  // The session's stream on kregd device `ordinal`; CudaDevices errors.
  absl::StatusOr<cu::CUstream> Get(int ordinal);

  std::unique_ptr<Fence> Record(int ordinal) override;

 private:
  CudaDevices* const devices_;
  absl::Mutex mu_;
  std::vector<cu::CUstream> streams_ ABSL_GUARDED_BY(mu_);  // by ordinal
};

}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_CUDA_SESSION_STREAMS_H_
