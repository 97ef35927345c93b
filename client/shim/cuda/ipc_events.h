// Interprocess events for stream ordering between XLA's stream and kregd's
// session stream (DESIGN §3).
#ifndef KREGD_CLIENT_SHIM_CUDA_IPC_EVENTS_H_
#define KREGD_CLIENT_SHIM_CUDA_IPC_EVENTS_H_

#include <memory>

#include "common/cuda_driver.h"
#include "common/status.h"

namespace kreg::cuda_client {

// Two interprocess events of one device, made once per session and device,
// their handles sent to kregd once (kregd's CudaSession::SetEvents):
//   ready: recorded on XLA's stream before a request; kregd's session stream
//          waits for it before running the handler;
//   done:  recorded by kregd after the handler; XLA's stream waits for it
//          after the reply.
// Each wait binds to the latest record before it, so one pair serves every
// launch of a session (launches on a session are sequential). Not
// thread-safe. The driver must outlive it.
class IpcEventPair {
 public:
  // Creates both events (CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING) in
  // `context` (XLA's stream's, see StreamDevice) and gets their handles.
  // UNAVAILABLE without a driver; the driver's errors otherwise.
  static ClientStatus Create(const cu::CudaDriver* driver,
                             cu::CUcontext context,
                             std::unique_ptr<IpcEventPair>* out);
  ~IpcEventPair();
  IpcEventPair(const IpcEventPair&) = delete;
  IpcEventPair& operator=(const IpcEventPair&) = delete;

  const cu::CUipcEventHandle& ready_handle() const { return ready_handle_; }
  const cu::CUipcEventHandle& done_handle() const { return done_handle_; }

  // cuEventRecord(ready, stream): before sending the launch.
  ClientStatus RecordReady(cu::CUstream stream);
  // cuStreamWaitEvent(stream, done): after kregd's reply. XLA's later work on
  // `stream` then runs after the handler's.
  ClientStatus WaitDone(cu::CUstream stream);

 private:
  IpcEventPair(const cu::CudaDriver* driver, cu::CUcontext context)
      : driver_(driver), context_(context) {}

  const cu::CudaDriver* const driver_;
  const cu::CUcontext context_;
  cu::CUevent ready_ = nullptr;
  cu::CUevent done_ = nullptr;
  cu::CUipcEventHandle ready_handle_{};
  cu::CUipcEventHandle done_handle_{};
};

}  // namespace kreg::cuda_client

#endif  // KREGD_CLIENT_SHIM_CUDA_IPC_EVENTS_H_
