#include "client/shim/cuda/staging_buffer.h"

#include <algorithm>
#include <string>
#include <utility>

namespace kreg::cuda_client {
namespace {

ClientStatus Failed(const cu::CudaDriver& d, cu::CUresult r,
                    const std::string& what) {
  int code = kInternal;
  if (r == cu::CUDA_ERROR_OUT_OF_MEMORY) code = kResourceExhausted;
  if (r == cu::CUDA_ERROR_NOT_SUPPORTED || r == cu::CUDA_ERROR_NOT_PERMITTED) {
    code = kFailedPrecondition;
  }
  if (r == cu::CUDA_ERROR_INVALID_VALUE || r == cu::CUDA_ERROR_INVALID_DEVICE) {
    code = kInvalidArgument;
  }
  return ClientStatus::Error(code, what + ": " + cu::DescribeCuResult(d, r));
}

}  // namespace

ClientStatus StagingBuffer::Create(const cu::CudaDriver* driver, int ordinal,
                                   uint64_t size,
                                   std::unique_ptr<StagingBuffer>* out) {
  if (driver == nullptr) {
    return ClientStatus::Error(
        kUnavailable,
        "no CUDA driver in this process (libcuda.so.1 could "
        "not be loaded)");
  }
  if (size == 0) {
    return ClientStatus::Error(kInvalidArgument, "a staging buffer of 0 bytes");
  }
  const cu::CudaDriver& d = *driver;
  cu::CUdevice dev = 0;
  cu::CUresult r = d.cuDeviceGet(&dev, ordinal);
  if (r != cu::CUDA_SUCCESS) return Failed(d, r, "cuDeviceGet");
  cu::CUmemAllocationProp prop{};
  prop.type = cu::CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = cu::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = cu::CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  size_t granularity = 0;
  r = d.cuMemGetAllocationGranularity(&granularity, &prop,
                                      cu::CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (r != cu::CUDA_SUCCESS) {
    return Failed(d, r, "cuMemGetAllocationGranularity");
  }
  if (granularity == 0) granularity = 1;
  if (size > UINT64_MAX - granularity) {
    return ClientStatus::Error(kResourceExhausted, "staging buffer too large");
  }
  const uint64_t rounded = (size + granularity - 1) / granularity * granularity;
  std::unique_ptr<StagingBuffer> b(new StagingBuffer(driver, rounded));
  r = d.cuMemCreate(&b->handle_, rounded, &prop, 0);
  if (r != cu::CUDA_SUCCESS) {
    return Failed(d, r, "cuMemCreate of " + std::to_string(rounded) + " bytes");
  }
  b->created_ = true;
  r = d.cuMemAddressReserve(&b->base_, rounded, 0, 0, 0);
  if (r != cu::CUDA_SUCCESS) {
    b->base_ = 0;
    return Failed(d, r, "cuMemAddressReserve");
  }
  r = d.cuMemMap(b->base_, rounded, 0, b->handle_, 0);
  if (r != cu::CUDA_SUCCESS) return Failed(d, r, "cuMemMap");
  b->mapped_ = true;
  cu::CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = cu::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r = d.cuMemSetAccess(b->base_, rounded, &access, 1);
  if (r != cu::CUDA_SUCCESS) return Failed(d, r, "cuMemSetAccess");
  *out = std::move(b);
  return ClientStatus::Ok();
}

StagingBuffer::~StagingBuffer() {
  if (mapped_) driver_->cuMemUnmap(base_, size_);
  if (base_ != 0) driver_->cuMemAddressFree(base_, size_);
  if (created_) driver_->cuMemRelease(handle_);
}

ClientStatus StagingBuffer::Export(ExportedBuffer* out) const {
  ClientStatus s = ExportBuffer(
      driver_, reinterpret_cast<const void*>(static_cast<uintptr_t>(base_)),
      out);
  if (s.ok() && out->kind != ExportKind::kVmmFd) {
    return ClientStatus::Error(
        kInternal,
        "a staging buffer could not be exported: " + out->staging_reason);
  }
  return s;
}

ClientStatus LayoutStaging(const std::vector<StagedBuffer>& buffers,
                           uint64_t align, StagingLayout* out) {
  if (align == 0) align = 1;
  const size_t n = buffers.size();
  StagingLayout l;
  l.offsets.assign(n, 0);
  l.copy_in.assign(n, false);
  l.copy_out.assign(n, false);
  // Per buffer, the first buffer of its (data, bytes) group, and whether the
  // group already has its copy in / copy out.
  std::vector<size_t> group(n, 0);
  std::vector<bool> has_in(n, false), has_out(n, false);
  uint64_t cursor = 0;
  for (size_t i = 0; i < n; ++i) {
    const StagedBuffer& b = buffers[i];
    if (b.bytes == 0) continue;  // nothing to stage: no region, no copy
    size_t first = i;
    for (size_t j = 0; j < i; ++j) {
      if (buffers[j].bytes == b.bytes && buffers[j].data == b.data) {
        first = group[j];
        break;
      }
    }
    group[i] = first;
    if (first == i) {
      if (b.bytes > UINT64_MAX - (align - 1)) {
        return ClientStatus::Error(
            kInvalidArgument, "a staged buffer of " + std::to_string(b.bytes) +
                                  " bytes is too large");
      }
      const uint64_t region = (b.bytes + align - 1) / align * align;
      if (cursor > UINT64_MAX - region) {
        return ClientStatus::Error(
            kInvalidArgument, "the staged buffers of a call overflow 64 bits");
      }
      l.offsets[i] = cursor;
      cursor += region;
    } else {
      l.offsets[i] = l.offsets[first];
    }
    if (b.is_input && !has_in[first]) {
      l.copy_in[i] = true;
      has_in[first] = true;
    }
    if (!b.is_input && !has_out[first]) {
      l.copy_out[i] = true;
      has_out[first] = true;
    }
  }
  l.bytes = cursor;
  *out = std::move(l);
  return ClientStatus::Ok();
}

namespace {
constexpr size_t kMaxRetired = 4;
}  // namespace

StagingArena::~StagingArena() {
  if (current_.buffer == nullptr && current_.last_use == nullptr &&
      retired_.empty()) {
    return;
  }
  bool pushed = context_ != nullptr &&
                driver_->cuCtxPushCurrent(context_) == cu::CUDA_SUCCESS;
  for (Slot& s : retired_) Free(&s);
  retired_.clear();
  Free(&current_);
  if (pushed) {
    cu::CUcontext popped;
    driver_->cuCtxPopCurrent(&popped);
  }
}

void StagingArena::Leak() {
  for (Slot& s : retired_) (void)s.buffer.release();
  retired_.clear();
  (void)current_.buffer.release();
  current_ = Slot();
}

bool StagingArena::WaitIdle(Slot* s) {
  if (s->buffer == nullptr) return true;
  if (s->record_failed) {
    return s->last_stream == nullptr ||
           driver_->cuStreamSynchronize(s->last_stream) == cu::CUDA_SUCCESS;
  }
  if (!s->recorded) return true;  // never used by a call
  return driver_->cuEventSynchronize(s->last_use) == cu::CUDA_SUCCESS;
}

void StagingArena::Free(Slot* s) {
  if (!WaitIdle(s)) {
    // Work that may use it could not be confirmed done (e.g. a sticky
    // error): leak it rather than unmap memory under a running copy.
    (void)s->buffer.release();
  }
  s->buffer.reset();
  if (s->last_use != nullptr) driver_->cuEventDestroy(s->last_use);
  *s = Slot();
}

void StagingArena::Reap() {
  for (auto it = retired_.begin(); it != retired_.end();) {
    cu::CUresult r = cu::CUDA_SUCCESS;
    if (it->record_failed) {
      r = it->last_stream != nullptr ? driver_->cuStreamQuery(it->last_stream)
                                     : cu::CUDA_SUCCESS;
    } else if (it->recorded) {
      r = driver_->cuEventQuery(it->last_use);
    }
    if (r == cu::CUDA_SUCCESS) {
      Free(&*it);
      it = retired_.erase(it);
    } else {
      ++it;
    }
  }
}

ClientStatus StagingArena::Acquire(cu::CUstream stream, uint64_t bytes,
                                   AllocationId* retired) {
  if (retired != nullptr) *retired = AllocationId();
  if (driver_ == nullptr) {
    return ClientStatus::Error(
        kUnavailable,
        "no CUDA driver in this process (libcuda.so.1 could "
        "not be loaded)");
  }
  if (bytes == 0) {
    return ClientStatus::Error(kInvalidArgument, "staging 0 bytes");
  }
  if (!retired_.empty()) Reap();
  const cu::CudaDriver& d = *driver_;
  if (current_.buffer != nullptr && current_.buffer->size() >= bytes) {
    // Order this call after the previous one's copies when they were
    // queued on another stream.
    if (current_.record_failed) {
      if (current_.last_stream != nullptr) {
        cu::CUresult r = d.cuStreamSynchronize(current_.last_stream);
        if (r != cu::CUDA_SUCCESS) {
          return Failed(d, r,
                        "waiting for the previous use of the staging buffer");
        }
      }
      current_.record_failed = false;
      current_.recorded = false;
    } else if (current_.recorded && current_.last_stream != stream) {
      cu::CUresult r = d.cuStreamWaitEvent(stream, current_.last_use, 0);
      if (r != cu::CUDA_SUCCESS) {
        return Failed(d, r,
                      "cuStreamWaitEvent on the staging buffer's last use");
      }
    }
    return ClientStatus::Ok();
  }
  // Grow (or create): a new buffer; the old one is retired, freed once its
  // last use has completed.
  uint64_t want = bytes;
  if (current_.buffer != nullptr && current_.buffer->size() <= UINT64_MAX / 2) {
    want = std::max<uint64_t>(bytes, current_.buffer->size() * 2);
  }
  std::unique_ptr<StagingBuffer> fresh;
  ClientStatus s = StagingBuffer::Create(driver_, ordinal_, want, &fresh);
  if (!s.ok() && want > bytes) {
    s = StagingBuffer::Create(driver_, ordinal_, bytes, &fresh);
  }
  if (!s.ok()) {
    return ClientStatus::Error(s.code, "creating a staging buffer of " +
                                           std::to_string(bytes) +
                                           " bytes: " + s.message);
  }
  Slot slot;
  s = IdentifyBuffer(
      driver_,
      reinterpret_cast<const void*>(static_cast<uintptr_t>(fresh->data())),
      &slot.id);
  if (!s.ok()) {
    return ClientStatus::Error(s.code,
                               "identifying the staging buffer: " + s.message);
  }
  cu::CUresult r = d.cuEventCreate(&slot.last_use, cu::CU_EVENT_DISABLE_TIMING);
  if (r != cu::CUDA_SUCCESS) {
    return Failed(d, r, "cuEventCreate for the staging buffer");
  }
  slot.buffer = std::move(fresh);
  if (current_.buffer != nullptr) {
    if (retired != nullptr) *retired = current_.id;
    retired_.push_back(std::exchange(current_, Slot()));
  } else if (current_.last_use != nullptr) {
    Free(&current_);
  }
  current_ = std::move(slot);
  // Bound what waits to be freed (host waits only after many growths).
  while (retired_.size() > kMaxRetired) {
    Free(&retired_.front());
    retired_.erase(retired_.begin());
  }
  return ClientStatus::Ok();
}

ClientStatus StagingArena::Release(cu::CUstream stream) {
  if (current_.buffer == nullptr || current_.last_use == nullptr) {
    return ClientStatus::Ok();
  }
  current_.last_stream = stream;
  cu::CUresult r = driver_->cuEventRecord(current_.last_use, stream);
  if (r != cu::CUDA_SUCCESS) {
    current_.record_failed = true;
    current_.recorded = false;
    return Failed(*driver_, r, "cuEventRecord of the staging buffer's use");
  }
  current_.recorded = true;
  current_.record_failed = false;
  return ClientStatus::Ok();
}

}  // namespace kreg::cuda_client
