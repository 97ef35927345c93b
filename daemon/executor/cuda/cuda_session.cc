#include "daemon/executor/cuda/cuda_session.h"

#include <chrono>
#include <cstdint>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace kreg {

CudaSession::CudaSession(CudaDevices* devices, CudaSessionOptions options)
    : devices_(devices),
      doorbell_grace_(options.doorbell_grace),
      streams_(devices),
      cache_(options.cache, &streams_) {}

CudaSession::~CudaSession() {
  CloseDoorbells();
  {
    absl::MutexLock lock(&mu_);
    events_.clear();
    allocators_.clear();
  }
  cache_.Close();
}

absl::Status CudaSession::ShareVmm(const CudaMappingKey& key, UniqueFd fd) {
  KREG_ASSIGN_OR_RETURN(int ordinal, devices_->FindByUuid(key.device_uuid));
  return cache_
      .GetOrImport(key,
                   [&] {
                     return VmmImport::Import(devices_, ordinal, std::move(fd),
                                              key.size);
                   })
      .status();
}

absl::Status CudaSession::ShareIpc(const CudaMappingKey& key,
                                   const cu::CUipcMemHandle& handle) {
  KREG_ASSIGN_OR_RETURN(int ordinal, devices_->FindByUuid(key.device_uuid));
  return cache_
      .GetOrImport(
          key,
          [&] { return IpcMemOpen::Open(devices_, ordinal, handle, key.size); })
      .status();
}

absl::Status CudaSession::SetEvents(absl::string_view device_uuid,
                                    const cu::CUipcEventHandle& ready,
                                    const cu::CUipcEventHandle& done) {
  KREG_ASSIGN_OR_RETURN(int ordinal, devices_->FindByUuid(device_uuid));
  auto pair = std::make_shared<EventPair>();
  KREG_ASSIGN_OR_RETURN(pair->ready,
                        IpcEventOpen::Open(devices_, ordinal, ready));
  KREG_ASSIGN_OR_RETURN(pair->done,
                        IpcEventOpen::Open(devices_, ordinal, done));
  std::shared_ptr<EventPair> old;
  {
    absl::MutexLock lock(&mu_);
    old = std::exchange(events_[ordinal], std::move(pair));
  }
  return absl::OkStatus();  // `old` is destroyed here, outside the lock.
}

absl::Status CudaSession::SetDoorbell(absl::string_view device_uuid,
                                      UniqueFd fd, uint64_t size,
                                      uint64_t ready_offset,
                                      uint64_t done_offset) {
  KREG_ASSIGN_OR_RETURN(int ordinal, devices_->FindByUuid(device_uuid));
  KREG_RETURN_IF_ERROR(devices_->CheckUsable(ordinal));
  const CudaDeviceInfo& info = devices_->info(ordinal);
  if (!info.memops64) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA device ", info.uuid_text,
        " does not support 64-bit stream memory operations "
        "(CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS); use events"));
  }
  auto word_ok = [&](uint64_t off) {
    return off % 8 == 0 && size >= 8 && off <= size - 8;
  };
  if (!word_ok(ready_offset) || !word_ok(done_offset) ||
      (ready_offset > done_offset ? ready_offset - done_offset
                                  : done_offset - ready_offset) < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a doorbell of ", size, " bytes needs two distinct 8-byte aligned ",
        "words inside it, got offsets ", ready_offset, " and ", done_offset));
  }
  {
    absl::MutexLock lock(&mu_);
    if (doorbells_.count(ordinal) != 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("this session already has a doorbell for CUDA device ",
                       info.uuid_text));
    }
  }
  KREG_ASSIGN_OR_RETURN(cu::CUstream stream, streams_.Get(ordinal));
  KREG_ASSIGN_OR_RETURN(
      auto m, VmmImport::Import(devices_, ordinal, std::move(fd), size));
  auto bell = std::make_shared<Doorbell>();
  bell->mapping = std::move(m);
  bell->ready = bell->mapping->base() + ready_offset;
  bell->done = bell->mapping->base() + done_offset;
  CudaContextScope scope(*devices_, ordinal);
  if (!scope.status().ok()) return scope.status();
  const cu::CudaDriver& d = *devices_->driver();
  for (cu::CUdeviceptr word : {bell->ready, bell->done}) {
    KREG_RETURN_IF_ERROR(
        devices_->Check(ordinal,
                        d.cuStreamWriteValue64(
                            stream, word, 0, cu::CU_STREAM_WRITE_VALUE_DEFAULT),
                        "cuStreamWriteValue64 zeroing the doorbell"));
  }
  KREG_RETURN_IF_ERROR(devices_->Check(ordinal, d.cuStreamSynchronize(stream),
                                       "cuStreamSynchronize after zeroing "
                                       "the doorbell"));
  absl::MutexLock lock(&mu_);
  doorbells_[ordinal] = std::move(bell);
  return absl::OkStatus();
}

bool CudaSession::HasDoorbell(int ordinal) {
  absl::MutexLock lock(&mu_);
  return doorbells_.count(ordinal) != 0;
}

void CudaSession::CloseDoorbells() {
  std::map<int, std::shared_ptr<Doorbell>> bells;
  {
    absl::MutexLock lock(&mu_);
    bells.swap(doorbells_);
  }
  const cu::CudaDriver& d = *devices_->driver();
  for (auto& [ordinal, bell] : bells) {
    std::unique_ptr<Fence> fence = streams_.Record(ordinal);
    if (fence == nullptr) continue;  // nothing queued, or the device failed
    const auto deadline = std::chrono::steady_clock::now() + doorbell_grace_;
    while (!fence->Done() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (!fence->Done()) {
      spdlog::warn(
          "closing a session: its stream on CUDA device {} still waits for "
          "the client's doorbell after {} ms; releasing the wait",
          ordinal, doorbell_grace_.count());
      CudaContextScope scope(*devices_, ordinal);
      cu::CUstream side = nullptr;
      if (d.cuStreamCreate(&side, cu::CU_STREAM_NON_BLOCKING) ==
          cu::CUDA_SUCCESS) {
        cu::CUresult r = d.cuStreamWriteValue64(
            side, bell->ready, cu::ReleaseValue(bell->last_seq.load()),
            cu::CU_STREAM_WRITE_VALUE_DEFAULT);
        if (r == cu::CUDA_SUCCESS) r = d.cuStreamSynchronize(side);
        if (r != cu::CUDA_SUCCESS) {
          spdlog::warn("releasing a doorbell wait failed: {}",
                       cu::DescribeCuResult(d, r));
        }
        d.cuStreamDestroy(side);
      }
      fence->Wait();
    }
  }
  // `bells` unmaps here, after the streams passed every use.
}

absl::StatusOr<CudaMappingCache::Resolved> CudaSession::Resolve(
    const CudaMappingKey& key, uint64_t offset, uint64_t length) {
  return cache_.Resolve(key, offset, length);
}

StreamOrderedAllocator* CudaSession::AllocatorFor(int ordinal,
                                                  cu::CUstream stream) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<StreamOrderedAllocator>& a = allocators_[ordinal];
  if (a == nullptr) {
    a = std::make_unique<StreamOrderedAllocator>(devices_, ordinal, stream);
  }
  return a.get();
}

absl::Status CudaSession::Launch(
    int ordinal, const std::function<absl::Status(const CallOptions&)>& run,
    uint64_t doorbell_seq, bool* signalled) {
  if (signalled != nullptr) *signalled = false;
  KREG_RETURN_IF_ERROR(devices_->CheckUsable(ordinal));
  KREG_ASSIGN_OR_RETURN(cu::CUstream stream, streams_.Get(ordinal));
  CudaContextScope scope(*devices_, ordinal);
  if (!scope.status().ok()) return scope.status();
  std::shared_ptr<EventPair> events;
  std::shared_ptr<Doorbell> bell;
  if (doorbell_seq == 0) {
    absl::MutexLock lock(&mu_);
    auto it = events_.find(ordinal);
    if (it != events_.end()) events = it->second;
  }
  const cu::CudaDriver& d = *devices_->driver();
  if (doorbell_seq > 0) {
    KREG_ASSIGN_OR_RETURN(bell, DoorbellOf(ordinal, doorbell_seq));
    KREG_RETURN_IF_ERROR(
        devices_->Check(ordinal,
                        d.cuStreamWaitValue64(stream, bell->ready, doorbell_seq,
                                              cu::CU_STREAM_WAIT_VALUE_GEQ),
                        "cuStreamWaitValue64 on the client's doorbell"));
    bell->last_seq.store(doorbell_seq);
  } else if (events != nullptr) {
    KREG_RETURN_IF_ERROR(events->ready->WaitOn(stream));
  }
  CallOptions options;
  options.stream = stream;
  options.device_allocator = AllocatorFor(ordinal, stream);
  absl::Status result = run(options);
  if (bell != nullptr) {
    absl::Status s = WriteDone(ordinal, stream, *bell, doorbell_seq, signalled);
    if (result.ok()) result = s;
  } else if (events != nullptr) {
    absl::Status s = events->done->RecordOn(stream);
    if (result.ok()) result = s;
  }
  absl::Status probe = devices_->CheckStream(ordinal, stream);
  if (result.ok()) result = probe;
  cache_.Reap();
  return result;
}

absl::Status CudaSession::SignalDoorbell(int ordinal, uint64_t doorbell_seq,
                                         bool* signalled) {
  *signalled = false;
  KREG_RETURN_IF_ERROR(devices_->CheckUsable(ordinal));
  KREG_ASSIGN_OR_RETURN(cu::CUstream stream, streams_.Get(ordinal));
  CudaContextScope scope(*devices_, ordinal);
  if (!scope.status().ok()) return scope.status();
  KREG_ASSIGN_OR_RETURN(std::shared_ptr<Doorbell> bell,
                        DoorbellOf(ordinal, doorbell_seq));
  return WriteDone(ordinal, stream, *bell, doorbell_seq, signalled);
}

absl::StatusOr<std::shared_ptr<CudaSession::Doorbell>> CudaSession::DoorbellOf(
    int ordinal, uint64_t doorbell_seq) {
  absl::MutexLock lock(&mu_);
  auto it = doorbells_.find(ordinal);
  if (it == doorbells_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("a doorbell launch (sequence ", doorbell_seq,
                     ") but this session set up no doorbell for CUDA device ",
                     devices_->info(ordinal).uuid_text));
  }
  return it->second;
}

absl::Status CudaSession::WriteDone(int ordinal, cu::CUstream stream,
                                    const Doorbell& bell, uint64_t doorbell_seq,
                                    bool* signalled) {
  absl::Status s = devices_->Check(
      ordinal,
      devices_->driver()->cuStreamWriteValue64(
          stream, bell.done, doorbell_seq, cu::CU_STREAM_WRITE_VALUE_DEFAULT),
      "cuStreamWriteValue64 of the doorbell's done word");
  if (s.ok() && signalled != nullptr) *signalled = true;
  return s;
}

}  // namespace kreg
