#include "daemon/executor/cuda/stream_allocator.h"

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kreg {
namespace {

constexpr size_t kPoolAlignment = 256;

}  // namespace

StreamOrderedAllocator::StreamOrderedAllocator(CudaDevices* devices,
                                               int ordinal, cu::CUstream stream)
    : devices_(devices), ordinal_(ordinal), stream_(stream) {}

StreamOrderedAllocator::~StreamOrderedAllocator() {
  std::vector<cu::CUdeviceptr> leftover;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [ptr, raw] : live_) leftover.push_back(raw);
    live_.clear();
  }
  for (cu::CUdeviceptr raw : leftover) FreeRaw(raw).IgnoreError();
}

absl::StatusOr<void*> StreamOrderedAllocator::Allocate(size_t size,
                                                       size_t alignment) {
  if (size == 0) return nullptr;
  if (alignment == 0) alignment = 1;
  if ((alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scratch alignment ", alignment, " is not a power of two"));
  }
  KREG_RETURN_IF_ERROR(devices_->CheckUsable(ordinal_));
  if (!devices_->info(ordinal_).memory_pools) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA device ", devices_->info(ordinal_).uuid_text,
        " has no memory pools (cuMemAllocAsync): no scratch memory"));
  }
  const size_t pad = alignment > kPoolAlignment ? alignment - 1 : 0;
  if (size > SIZE_MAX - pad) {
    return absl::ResourceExhaustedError(
        absl::StrCat("scratch allocation of ", size, " bytes is too large"));
  }
  CudaContextScope scope(*devices_, ordinal_);
  if (!scope.status().ok()) return scope.status();
  cu::CUdeviceptr raw = 0;
  KREG_RETURN_IF_ERROR(devices_->Check(
      ordinal_, devices_->driver()->cuMemAllocAsync(&raw, size + pad, stream_),
      absl::StrCat("cuMemAllocAsync of ", size + pad, " scratch bytes")));
  const cu::CUdeviceptr aligned =
      (raw + alignment - 1) & ~static_cast<cu::CUdeviceptr>(alignment - 1);
  if (aligned + size > raw + size + pad) {  // The pool under-aligned: redo.
    FreeRaw(raw).IgnoreError();
    return absl::InternalError(absl::StrCat("cuMemAllocAsync returned 0x",
                                            absl::Hex(raw), ", not aligned to ",
                                            kPoolAlignment, " bytes"));
  }
  void* ptr = reinterpret_cast<void*>(static_cast<uintptr_t>(aligned));
  absl::MutexLock lock(&mu_);
  live_[ptr] = raw;
  return ptr;
}

absl::Status StreamOrderedAllocator::Free(void* data, size_t size) {
  if (data == nullptr) return absl::OkStatus();
  cu::CUdeviceptr raw = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(data);
    if (it == live_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "scratch free of 0x", absl::Hex(reinterpret_cast<uintptr_t>(data)),
          " (", size, " bytes): not allocated by this call's allocator"));
    }
    raw = it->second;
    live_.erase(it);
  }
  return FreeRaw(raw);
}

absl::Status StreamOrderedAllocator::FreeRaw(cu::CUdeviceptr raw) {
  CudaContextScope scope(*devices_, ordinal_);
  if (!scope.status().ok()) return scope.status();
  return devices_->Check(ordinal_,
                         devices_->driver()->cuMemFreeAsync(raw, stream_),
                         "cuMemFreeAsync of scratch memory");
}

size_t StreamOrderedAllocator::live_allocations() const {
  absl::MutexLock lock(&mu_);
  return live_.size();
}

}  // namespace kreg
