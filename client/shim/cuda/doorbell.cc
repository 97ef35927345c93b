#include "client/shim/cuda/doorbell.h"

#include <time.h>

#include <string>
#include <utility>

#include "common/status_macros.h"

namespace kreg::cuda_client {
namespace {

// How long the destructor lets kregd's `done` write arrive by itself.
constexpr int kGraceMs = 5000;

ClientStatus Failed(const cu::CudaDriver& d, cu::CUresult r, const char* what) {
  return ClientStatus::Error(
      r == cu::CUDA_ERROR_NOT_SUPPORTED ? kFailedPrecondition : kInternal,
      std::string(what) + ": " + cu::DescribeCuResult(d, r));
}

}  // namespace

ClientStatus Doorbell::Create(const cu::CudaDriver* driver, int ordinal,
                              cu::CUcontext context,
                              std::unique_ptr<Doorbell>* out) {
  if (driver == nullptr) {
    return ClientStatus::Error(
        kUnavailable,
        "no CUDA driver in this process (libcuda.so.1 could "
        "not be loaded)");
  }
  const cu::CudaDriver& d = *driver;
  cu::CUdevice dev = 0;
  cu::CUresult r = d.cuDeviceGet(&dev, ordinal);
  if (r != cu::CUDA_SUCCESS) return Failed(d, r, "cuDeviceGet");
  int memops = 0;
  r = d.cuDeviceGetAttribute(
      &memops, cu::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, dev);
  if (r != cu::CUDA_SUCCESS || memops == 0) {
    return ClientStatus::Error(
        kFailedPrecondition,
        "the device does not support 64-bit stream memory "
        "operations");
  }
  std::unique_ptr<Doorbell> bell(new Doorbell(driver, context));
  KREG_RETURN_IF_ERROR(
      StagingBuffer::Create(driver, ordinal, kDoneOffset + 8, &bell->buffer_));
  r = d.cuEventCreate(&bell->last_use_, cu::CU_EVENT_DISABLE_TIMING);
  if (r != cu::CUDA_SUCCESS) {
    bell->last_use_ = nullptr;
    return Failed(d, r, "cuEventCreate for the doorbell");
  }
  *out = std::move(bell);
  return ClientStatus::Ok();
}

Doorbell::~Doorbell() {
  if (buffer_ == nullptr && last_use_ == nullptr) return;
  const cu::CudaDriver& d = *driver_;
  bool pushed =
      context_ != nullptr && d.cuCtxPushCurrent(context_) == cu::CUDA_SUCCESS;
  bool idle = !recorded_;
  if (!idle) {
    for (int ms = 0; ms < kGraceMs; ++ms) {
      cu::CUresult r = d.cuEventQuery(last_use_);
      if (r != cu::CUDA_ERROR_NOT_READY) {
        idle = r == cu::CUDA_SUCCESS;
        break;
      }
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, nullptr);
    }
    if (!idle && buffer_ != nullptr) {
      cu::CUstream side = nullptr;
      if (d.cuStreamCreate(&side, cu::CU_STREAM_NON_BLOCKING) ==
          cu::CUDA_SUCCESS) {
        if (d.cuStreamWriteValue64(side, done(), cu::ReleaseValue(awaited_),
                                   cu::CU_STREAM_WRITE_VALUE_DEFAULT) ==
            cu::CUDA_SUCCESS) {
          d.cuStreamSynchronize(side);
        }
        d.cuStreamDestroy(side);
      }
      idle = d.cuEventSynchronize(last_use_) == cu::CUDA_SUCCESS;
    }
  }
  // Never unmap memory a queued wait may still read: leak it instead.
  if (!idle) (void)buffer_.release();
  buffer_.reset();
  if (last_use_ != nullptr) d.cuEventDestroy(last_use_);
  if (pushed) {
    cu::CUcontext popped;
    d.cuCtxPopCurrent(&popped);
  }
}

bool Doorbell::Pending() const {
  if (!recorded_) return false;
  // Any thread: the event's context is made current for the query.
  const cu::CudaDriver& d = *driver_;
  bool pushed =
      context_ != nullptr && d.cuCtxPushCurrent(context_) == cu::CUDA_SUCCESS;
  const bool pending = d.cuEventQuery(last_use_) == cu::CUDA_ERROR_NOT_READY;
  if (pushed) {
    cu::CUcontext popped;
    d.cuCtxPopCurrent(&popped);
  }
  return pending;
}

bool Doorbell::Abandon(const std::function<void()>& before_release) {
  if (buffer_ == nullptr || awaited_ == 0) return false;
  const cu::CudaDriver& d = *driver_;
  // The rescue runs in a context of its own when the driver can make one:
  // the XLA stream blocked in cuStreamWaitValue64 on `done` holds one of
  // its context's hardware queues, and a stream of that context may be
  // placed behind it (CUDA cannot see that our write would unblock it), so
  // the read and the write below would wait forever. Another context has
  // its own queues; the doorbell's VMM mapping is accessible from every
  // context of the process on its device (access is granted per device).
  cu::CUcontext rescue = nullptr;
  cu::CUdevice device = 0;
  bool pushed =
      context_ != nullptr && d.cuCtxPushCurrent(context_) == cu::CUDA_SUCCESS;
  if (pushed && d.cuCtxCreate != nullptr &&
      d.cuCtxGetDevice(&device) == cu::CUDA_SUCCESS) {
    cu::CUcontext popped;
    d.cuCtxPopCurrent(&popped);
    pushed = false;
    if (d.cuCtxCreate(&rescue, nullptr, 0, device) != cu::CUDA_SUCCESS) {
      rescue = nullptr;  // fall back to the doorbell's own context
      pushed = d.cuCtxPushCurrent(context_) == cu::CUDA_SUCCESS;
    }
  }
  bool lost = true;  // unless `done` says otherwise
  cu::CUstream side = nullptr;
  if (d.cuStreamCreate(&side, cu::CU_STREAM_NON_BLOCKING) == cu::CUDA_SUCCESS) {
    uint64_t done_value = 0;
    if (d.cuMemcpyDtoHAsync(&done_value, done(), sizeof(done_value), side) ==
            cu::CUDA_SUCCESS &&
        d.cuStreamSynchronize(side) == cu::CUDA_SUCCESS) {
      lost = done_value < awaited_;
    }
    if (lost && before_release) before_release();
    if (lost && d.cuStreamWriteValue64(side, done(), cu::ReleaseValue(awaited_),
                                       cu::CU_STREAM_WRITE_VALUE_DEFAULT) ==
                    cu::CUDA_SUCCESS) {
      d.cuStreamSynchronize(side);
    }
    d.cuStreamDestroy(side);
  }
  if (lost && side == nullptr && before_release) before_release();
  if (rescue != nullptr) d.cuCtxDestroy(rescue);  // also pops it
  if (pushed) {
    cu::CUcontext popped;
    d.cuCtxPopCurrent(&popped);
  }
  return lost;
}

void Doorbell::Leak() {
  (void)buffer_.release();
  last_use_ = nullptr;
  recorded_ = false;
}

ClientStatus Doorbell::Export(UniqueFd* fd) const {
  ExportedBuffer ex;
  KREG_RETURN_IF_ERROR(buffer_->Export(&ex));
  *fd = std::move(ex.fd);
  return ClientStatus::Ok();
}

ClientStatus Doorbell::Ring(cu::CUstream stream, uint64_t seq) {
  const cu::CudaDriver& d = *driver_;
  if (recorded_ && stream != last_stream_) {
    cu::CUresult r = d.cuStreamWaitEvent(stream, last_use_, 0);
    if (r != cu::CUDA_SUCCESS) {
      return Failed(d, r, "cuStreamWaitEvent on the doorbell's last use");
    }
  }
  cu::CUresult r = d.cuStreamWriteValue64(stream, ready(), seq,
                                          cu::CU_STREAM_WRITE_VALUE_DEFAULT);
  if (r != cu::CUDA_SUCCESS) {
    return Failed(d, r, "cuStreamWriteValue64 of the doorbell's ready word");
  }
  return ClientStatus::Ok();
}

ClientStatus Doorbell::AwaitDone(cu::CUstream stream, uint64_t seq) {
  cu::CUresult r = driver_->cuStreamWaitValue64(stream, done(), seq,
                                                cu::CU_STREAM_WAIT_VALUE_GEQ);
  if (r == cu::CUDA_SUCCESS) awaited_ = seq;
  return r == cu::CUDA_SUCCESS
             ? ClientStatus::Ok()
             : Failed(*driver_, r,
                      "cuStreamWaitValue64 on kregd's doorbell done word");
}

ClientStatus Doorbell::Finish(cu::CUstream stream) {
  cu::CUresult r = driver_->cuEventRecord(last_use_, stream);
  if (r != cu::CUDA_SUCCESS) {
    return Failed(*driver_, r, "cuEventRecord of the doorbell's last use");
  }
  recorded_ = true;
  last_stream_ = stream;
  return ClientStatus::Ok();
}

}  // namespace kreg::cuda_client
