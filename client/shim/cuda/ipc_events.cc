#include "client/shim/cuda/ipc_events.h"

#include <string>

namespace kreg::cuda_client {
namespace {

ClientStatus Failed(const cu::CudaDriver& d, cu::CUresult r, const char* what) {
  return ClientStatus::Error(
      r == cu::CUDA_ERROR_INVALID_VALUE || r == cu::CUDA_ERROR_INVALID_HANDLE ||
              r == cu::CUDA_ERROR_INVALID_CONTEXT
          ? kInvalidArgument
          : kInternal,
      std::string(what) + ": " + cu::DescribeCuResult(d, r));
}

}  // namespace

ClientStatus IpcEventPair::Create(const cu::CudaDriver* driver,
                                  cu::CUcontext context,
                                  std::unique_ptr<IpcEventPair>* out) {
  if (driver == nullptr) {
    return ClientStatus::Error(
        kUnavailable,
        "no CUDA driver in this process (libcuda.so.1 could "
        "not be loaded)");
  }
  const cu::CudaDriver& d = *driver;
  std::unique_ptr<IpcEventPair> pair(new IpcEventPair(driver, context));
  bool pushed = false;
  if (context != nullptr) {
    cu::CUresult r = d.cuCtxPushCurrent(context);
    if (r != cu::CUDA_SUCCESS) return Failed(d, r, "cuCtxPushCurrent");
    pushed = true;
  }
  const unsigned int flags =
      cu::CU_EVENT_INTERPROCESS | cu::CU_EVENT_DISABLE_TIMING;
  ClientStatus s;
  cu::CUresult r = d.cuEventCreate(&pair->ready_, flags);
  if (r != cu::CUDA_SUCCESS) s = Failed(d, r, "cuEventCreate");
  if (s.ok()) {
    r = d.cuEventCreate(&pair->done_, flags);
    if (r != cu::CUDA_SUCCESS) s = Failed(d, r, "cuEventCreate");
  }
  if (s.ok()) {
    r = d.cuIpcGetEventHandle(&pair->ready_handle_, pair->ready_);
    if (r != cu::CUDA_SUCCESS) s = Failed(d, r, "cuIpcGetEventHandle");
  }
  if (s.ok()) {
    r = d.cuIpcGetEventHandle(&pair->done_handle_, pair->done_);
    if (r != cu::CUDA_SUCCESS) s = Failed(d, r, "cuIpcGetEventHandle");
  }
  if (pushed) {
    cu::CUcontext popped;
    d.cuCtxPopCurrent(&popped);
  }
  if (!s.ok()) return s;  // `pair` destroys what was created.
  *out = std::move(pair);
  return ClientStatus::Ok();
}

IpcEventPair::~IpcEventPair() {
  if (ready_ == nullptr && done_ == nullptr) return;
  bool pushed = context_ != nullptr &&
                driver_->cuCtxPushCurrent(context_) == cu::CUDA_SUCCESS;
  if (ready_ != nullptr) driver_->cuEventDestroy(ready_);
  if (done_ != nullptr) driver_->cuEventDestroy(done_);
  if (pushed) {
    cu::CUcontext popped;
    driver_->cuCtxPopCurrent(&popped);
  }
}

ClientStatus IpcEventPair::RecordReady(cu::CUstream stream) {
  cu::CUresult r = driver_->cuEventRecord(ready_, stream);
  return r == cu::CUDA_SUCCESS
             ? ClientStatus::Ok()
             : Failed(*driver_, r, "cuEventRecord of the ready event");
}

ClientStatus IpcEventPair::WaitDone(cu::CUstream stream) {
  cu::CUresult r = driver_->cuStreamWaitEvent(stream, done_, 0);
  return r == cu::CUDA_SUCCESS
             ? ClientStatus::Ok()
             : Failed(*driver_, r, "cuStreamWaitEvent on kregd's done event");
}

}  // namespace kreg::cuda_client
