#include "client/cuda/staging_buffer.h"

#include <string>

namespace kreg::cuda_client {
namespace {

Status Failed(const cu::CudaDriver& d, cu::CUresult r,
              const std::string& what) {
  int code = kInternal;
  if (r == cu::CUDA_ERROR_OUT_OF_MEMORY) code = kResourceExhausted;
  if (r == cu::CUDA_ERROR_NOT_SUPPORTED || r == cu::CUDA_ERROR_NOT_PERMITTED) {
    code = kFailedPrecondition;
  }
  if (r == cu::CUDA_ERROR_INVALID_VALUE || r == cu::CUDA_ERROR_INVALID_DEVICE) {
    code = kInvalidArgument;
  }
  return Status::Error(code, what + ": " + cu::DescribeCuResult(d, r));
}

}  // namespace

Status StagingBuffer::Create(const cu::CudaDriver* driver, int ordinal,
                             uint64_t size,
                             std::unique_ptr<StagingBuffer>* out) {
  if (driver == nullptr) {
    return Status::Error(kUnavailable,
                         "no CUDA driver in this process (libcuda.so.1 could "
                         "not be loaded)");
  }
  if (size == 0) {
    return Status::Error(kInvalidArgument, "a staging buffer of 0 bytes");
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
    return Status::Error(kResourceExhausted, "staging buffer too large");
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
  return Status::Ok();
}

StagingBuffer::~StagingBuffer() {
  if (mapped_) driver_->cuMemUnmap(base_, size_);
  if (base_ != 0) driver_->cuMemAddressFree(base_, size_);
  if (created_) driver_->cuMemRelease(handle_);
}

Status StagingBuffer::Export(ExportedBuffer* out) const {
  Status s = ExportBuffer(
      driver_, reinterpret_cast<const void*>(static_cast<uintptr_t>(base_)),
      out);
  if (s.ok() && out->kind != ExportKind::kVmmFd) {
    return Status::Error(kInternal, "a staging buffer could not be exported: " +
                                        out->staging_reason);
  }
  return s;
}

}  // namespace kreg::cuda_client
