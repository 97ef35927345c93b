#include "daemon/executor/cuda/session_streams.h"

#include <utility>

#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

// An event recorded on a session stream; destroyed with its device's context
// current.
class EventFence final : public Fence {
 public:
  EventFence(CudaDevices* devices, int ordinal, cu::CUevent event)
      : devices_(devices), ordinal_(ordinal), event_(event) {}
  ~EventFence() override {
    CudaContextScope scope(*devices_, ordinal_);
    devices_->driver()->cuEventDestroy(event_);
  }

  bool Done() override {
    cu::CUresult r = devices_->driver()->cuEventQuery(event_);
    if (r == cu::CUDA_ERROR_NOT_READY) return false;
    // Success, or an error: a failed device runs nothing that could still
    // touch the memory. Sticky errors are recorded for the device.
    devices_->Check(ordinal_, r, "cuEventQuery of a release fence")
        .IgnoreError();
    return true;
  }

  void Wait() override {
    devices_
        ->Check(ordinal_, devices_->driver()->cuEventSynchronize(event_),
                "cuEventSynchronize of a release fence")
        .IgnoreError();
  }

 private:
  CudaDevices* const devices_;
  const int ordinal_;
  const cu::CUevent event_;
};

}  // namespace

SessionStreams::SessionStreams(CudaDevices* devices) : devices_(devices) {}

SessionStreams::~SessionStreams() {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (streams_[i] == nullptr) continue;
    devices_->Unwatch(streams_[i]);
    const int ordinal = static_cast<int>(i);
    CudaContextScope scope(*devices_, ordinal);
    const cu::CudaDriver& d = *devices_->driver();
    cu::CUresult r = d.cuStreamSynchronize(streams_[i]);
    if (r != cu::CUDA_SUCCESS) {
      spdlog::warn("closing a session stream on CUDA device {}: {}", ordinal,
                   cu::DescribeCuResult(d, r));
    }
    d.cuStreamDestroy(streams_[i]);
  }
}

absl::StatusOr<cu::CUstream> SessionStreams::Get(int ordinal) {
  KREG_RETURN_IF_ERROR(devices_->CheckUsable(ordinal));
  absl::MutexLock lock(&mu_);
  if (streams_.size() <= static_cast<size_t>(ordinal)) {
    streams_.resize(devices_->count(), nullptr);
  }
  if (streams_[ordinal] != nullptr) return streams_[ordinal];
  CudaContextScope scope(*devices_, ordinal);
  if (!scope.status().ok()) return scope.status();
  cu::CUstream stream = nullptr;
  KREG_RETURN_IF_ERROR(devices_->Check(
      ordinal,
      devices_->driver()->cuStreamCreate(&stream, cu::CU_STREAM_NON_BLOCKING),
      "cuStreamCreate of a session stream"));
  streams_[ordinal] = stream;
  devices_->Watch(ordinal, stream);
  return stream;
}

std::unique_ptr<Fence> SessionStreams::Record(int ordinal) {
  cu::CUstream stream = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (ordinal < 0 || static_cast<size_t>(ordinal) >= streams_.size() ||
        streams_[ordinal] == nullptr) {
      return nullptr;  // Nothing was ever queued for this device.
    }
    stream = streams_[ordinal];
  }
  CudaContextScope scope(*devices_, ordinal);
  if (!scope.status().ok()) return nullptr;
  const cu::CudaDriver& d = *devices_->driver();
  cu::CUevent event = nullptr;
  if (!devices_
           ->Check(ordinal,
                   d.cuEventCreate(&event, cu::CU_EVENT_DISABLE_TIMING),
                   "cuEventCreate of a release fence")
           .ok()) {
    return nullptr;
  }
  auto fence = std::make_unique<EventFence>(devices_, ordinal, event);
  if (!devices_
           ->Check(ordinal, d.cuEventRecord(event, stream),
                   "cuEventRecord of a release fence")
           .ok()) {
    return nullptr;
  }
  return fence;
}

}  // namespace kreg
