#include "daemon/cuda/cuda_session.h"

#include <utility>

namespace kreg {

CudaSession::CudaSession(CudaDevices* devices, CudaSessionOptions options)
    : devices_(devices), streams_(devices), cache_(options.cache, &streams_) {}

CudaSession::~CudaSession() {
  {
    absl::MutexLock lock(&mu_);
    events_.clear();
    allocators_.clear();
  }
  cache_.Close();
}

absl::Status CudaSession::ShareVmm(const CudaMappingKey& key, UniqueFd fd) {
  absl::StatusOr<int> ordinal = devices_->FindByUuid(key.device_uuid);
  if (!ordinal.ok()) return ordinal.status();
  auto shared = cache_.GetOrImport(
      key, [&]() -> absl::StatusOr<std::unique_ptr<CudaMapping>> {
        auto m = VmmImport::Import(devices_, *ordinal, std::move(fd), key.size);
        if (!m.ok()) return m.status();
        return std::unique_ptr<CudaMapping>(std::move(*m));
      });
  return shared.status();
}

absl::Status CudaSession::ShareIpc(const CudaMappingKey& key,
                                   const cu::CUipcMemHandle& handle) {
  absl::StatusOr<int> ordinal = devices_->FindByUuid(key.device_uuid);
  if (!ordinal.ok()) return ordinal.status();
  auto shared = cache_.GetOrImport(
      key, [&]() -> absl::StatusOr<std::unique_ptr<CudaMapping>> {
        auto m = IpcMemOpen::Open(devices_, *ordinal, handle, key.size);
        if (!m.ok()) return m.status();
        return std::unique_ptr<CudaMapping>(std::move(*m));
      });
  return shared.status();
}

absl::Status CudaSession::SetEvents(absl::string_view device_uuid,
                                    const cu::CUipcEventHandle& ready,
                                    const cu::CUipcEventHandle& done) {
  absl::StatusOr<int> ordinal = devices_->FindByUuid(device_uuid);
  if (!ordinal.ok()) return ordinal.status();
  auto pair = std::make_shared<EventPair>();
  auto r = IpcEventOpen::Open(devices_, *ordinal, ready);
  if (!r.ok()) return r.status();
  auto d = IpcEventOpen::Open(devices_, *ordinal, done);
  if (!d.ok()) return d.status();
  pair->ready = std::move(*r);
  pair->done = std::move(*d);
  std::shared_ptr<EventPair> old;
  {
    absl::MutexLock lock(&mu_);
    old = std::exchange(events_[*ordinal], std::move(pair));
  }
  return absl::OkStatus();  // `old` is destroyed here, outside the lock.
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
    int ordinal, const std::function<absl::Status(const CallOptions&)>& run) {
  if (absl::Status s = devices_->CheckUsable(ordinal); !s.ok()) return s;
  absl::StatusOr<cu::CUstream> stream = streams_.Get(ordinal);
  if (!stream.ok()) return stream.status();
  CudaContextScope scope(*devices_, ordinal);
  if (!scope.status().ok()) return scope.status();
  std::shared_ptr<EventPair> events;
  {
    absl::MutexLock lock(&mu_);
    auto it = events_.find(ordinal);
    if (it != events_.end()) events = it->second;
  }
  if (events != nullptr) {
    if (absl::Status s = events->ready->WaitOn(*stream); !s.ok()) return s;
  }
  CallOptions options;
  options.stream = *stream;
  options.device_allocator = AllocatorFor(ordinal, *stream);
  absl::Status result = run(options);
  if (events != nullptr) {
    absl::Status s = events->done->RecordOn(*stream);
    if (result.ok()) result = s;
  }
  absl::Status probe = devices_->CheckStream(ordinal, *stream);
  if (result.ok()) result = probe;
  cache_.Reap();
  return result;
}

}  // namespace kreg
