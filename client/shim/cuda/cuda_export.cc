#include "client/shim/cuda/cuda_export.h"

#include <cstdio>
#include <utility>

#include "common/status_macros.h"

namespace kreg::cuda_client {
namespace {

// Allocations this thread identified lately, by buffer ID (IdentifyBuffer).
constexpr size_t kKnownAllocations = 8;
struct KnownAllocation {
  AllocationId id;
};
thread_local KnownAllocation t_known[kKnownAllocations];
thread_local size_t t_known_next = 0;

// Contexts this thread resolved lately (StreamDevice), by the driver's
// context ID, which no other context of the process ever gets: a context
// destroyed and re-created at the same address misses.
constexpr size_t kKnownContexts = 4;
struct KnownContext {
  unsigned long long id = 0;  // NOLINT: the driver's type; 0: empty
  cu::CUcontext ctx = nullptr;
  int ordinal = -1;
  std::string uuid;
};
thread_local KnownContext t_contexts[kKnownContexts];
thread_local size_t t_contexts_next = 0;

ClientStatus NoDriver() {
  return ClientStatus::Error(
      kUnavailable,
      "no CUDA driver in this process (libcuda.so.1 could "
      "not be loaded)");
}

std::string Describe(const cu::CudaDriver& d, cu::CUresult r) {
  return cu::DescribeCuResult(d, r);
}

ClientStatus CuError(const cu::CudaDriver& d, cu::CUresult r,
                     const char* what) {
  int code = kInternal;
  if (r == cu::CUDA_ERROR_INVALID_VALUE || r == cu::CUDA_ERROR_INVALID_HANDLE ||
      r == cu::CUDA_ERROR_INVALID_CONTEXT) {
    code = kInvalidArgument;
  } else if (r == cu::CUDA_ERROR_OUT_OF_MEMORY) {
    code = kResourceExhausted;
  } else if (r == cu::CUDA_ERROR_NOT_SUPPORTED ||
             r == cu::CUDA_ERROR_NOT_PERMITTED) {
    code = kFailedPrecondition;
  }
  return ClientStatus::Error(code, std::string(what) + ": " + Describe(d, r));
}

std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

const cu::CudaDriver* ProcessDriver(ClientStatus* status) {
  std::string error;
  const cu::CudaDriver* d = cu::LoadCudaDriver(&error);
  if (d == nullptr && status != nullptr) {
    *status = ClientStatus::Error(kUnavailable, error);
  }
  return d;
}

ClientStatus DeviceUuid(const cu::CudaDriver* driver, int ordinal,
                        std::string* uuid) {
  if (driver == nullptr) return NoDriver();
  cu::CUdevice dev = 0;
  cu::CUresult r = driver->cuDeviceGet(&dev, ordinal);
  if (r != cu::CUDA_SUCCESS) return CuError(*driver, r, "cuDeviceGet");
  cu::CUuuid raw;
  r = driver->cuDeviceGetUuid(&raw, dev);
  if (r != cu::CUDA_SUCCESS) return CuError(*driver, r, "cuDeviceGetUuid");
  uuid->assign(raw.bytes, sizeof(raw.bytes));
  return ClientStatus::Ok();
}

ClientStatus StreamDevice(const cu::CudaDriver* driver, cu::CUstream stream,
                          cu::CUcontext* context, int* ordinal,
                          std::string* uuid) {
  if (driver == nullptr) return NoDriver();
  cu::CUcontext ctx = nullptr;
  cu::CUresult r = driver->cuStreamGetCtx(stream, &ctx);
  if (r != cu::CUDA_SUCCESS) return CuError(*driver, r, "cuStreamGetCtx");
  // Seen before: the device of a context never changes (saves four driver
  // calls on every forwarded launch; bench/RESULTS.md, "Isolated calls").
  unsigned long long id = 0;  // NOLINT: the driver's type
  if (driver->cuCtxGetId == nullptr ||
      driver->cuCtxGetId(ctx, &id) != cu::CUDA_SUCCESS) {
    id = 0;
  }
  if (id != 0) {
    for (const KnownContext& k : t_contexts) {
      if (k.id != id || k.ctx != ctx) continue;
      if (context != nullptr) *context = ctx;
      if (ordinal != nullptr) *ordinal = k.ordinal;
      if (uuid != nullptr) *uuid = k.uuid;
      return ClientStatus::Ok();
    }
  }
  cu::CUdevice dev = 0;
  {
    PushContext push(*driver, ctx);
    r = driver->cuCtxGetDevice(&dev);
  }
  if (r != cu::CUDA_SUCCESS) return CuError(*driver, r, "cuCtxGetDevice");
  std::string device_uuid;
  KREG_RETURN_IF_ERROR(DeviceUuid(driver, dev, &device_uuid));
  if (id != 0) {
    KnownContext& k = t_contexts[t_contexts_next++ % kKnownContexts];
    k.id = id;
    k.ctx = ctx;
    k.ordinal = dev;
    k.uuid = device_uuid;
  }
  if (context != nullptr) *context = ctx;
  if (ordinal != nullptr) *ordinal = dev;
  if (uuid != nullptr) *uuid = std::move(device_uuid);
  return ClientStatus::Ok();
}

ClientStatus IdentifyBuffer(const cu::CudaDriver* driver, const void* ptr,
                            AllocationId* out, uint64_t* offset) {
  if (driver == nullptr) return NoDriver();
  const auto p = static_cast<cu::CUdeviceptr>(reinterpret_cast<uintptr_t>(ptr));
  unsigned long long buffer_id = 0;  // NOLINT: the driver's type
  int ordinal = -1;
  unsigned int memory_type = 0;
  cu::CUcontext ctx = nullptr;
  cu::CUpointer_attribute attrs[] = {cu::CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                     cu::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                     cu::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                     cu::CU_POINTER_ATTRIBUTE_CONTEXT};
  void* data[] = {&buffer_id, &ordinal, &memory_type, &ctx};
  cu::CUresult r = driver->cuPointerGetAttributes(4, attrs, data, p);
  if (r != cu::CUDA_SUCCESS) {
    return CuError(*driver, r, "cuPointerGetAttributes");
  }
  if (memory_type != cu::CU_MEMORYTYPE_DEVICE || ordinal < 0) {
    return ClientStatus::Error(kInvalidArgument,
                               "pointer " + Hex(p) +
                                   " is not CUDA device memory of this process "
                                   "(memory type " +
                                   std::to_string(memory_type) + ")");
  }
  // Seen before (a buffer ID is unique in the process for the life of its
  // allocation): the rest of the identification is known. Saves the
  // context juggling and cuMemGetAddressRange on every buffer of every
  // launch (DESIGN §9; bench/RESULTS.md, "Isolated calls").
  if (buffer_id != 0) {
    for (const KnownAllocation& k : t_known) {
      if (k.id.generation == buffer_id && k.id.device_ordinal == ordinal &&
          p >= k.id.base && p - k.id.base < k.id.size) {
        *out = k.id;
        if (offset != nullptr) *offset = p - k.id.base;
        return ClientStatus::Ok();
      }
    }
  }
  // The mapping holding the pointer: with XLA's default allocator one
  // mapping covers its whole pool, so one export serves every buffer.
  cu::CUdeviceptr base = 0;
  size_t size = 0;
  {
    // cuMemGetAddressRange needs a current context. VMM memory (XLA's) has
    // no owning context (CU_POINTER_ATTRIBUTE_CONTEXT is null): use the
    // current one, else the device's primary context (XLA's).
    cu::CUcontext current = nullptr;
    cu::CUdevice primary_dev = -1;
    if (ctx == nullptr &&
        (driver->cuCtxGetCurrent(&current) != cu::CUDA_SUCCESS ||
         current == nullptr)) {
      cu::CUdevice dev = 0;
      if (driver->cuDeviceGet(&dev, ordinal) == cu::CUDA_SUCCESS &&
          driver->cuDevicePrimaryCtxRetain(&ctx, dev) == cu::CUDA_SUCCESS) {
        primary_dev = dev;
      } else {
        ctx = nullptr;
      }
    }
    {
      PushContext push(*driver, ctx);
      r = driver->cuMemGetAddressRange(&base, &size, p);
    }
    if (primary_dev >= 0) driver->cuDevicePrimaryCtxRelease(primary_dev);
  }
  if (r != cu::CUDA_SUCCESS) return CuError(*driver, r, "cuMemGetAddressRange");
  if (size == 0 || p < base || p - base >= size) {
    return ClientStatus::Error(kInternal, "cuMemGetAddressRange of " + Hex(p) +
                                              " gave [" + Hex(base) + ", +" +
                                              std::to_string(size) +
                                              "), which does not hold it");
  }
  AllocationId id;
  KREG_RETURN_IF_ERROR(DeviceUuid(driver, ordinal, &id.device_uuid));
  id.device_ordinal = ordinal;
  id.base = base;
  id.size = size;
  id.generation = buffer_id;
  if (buffer_id != 0) {
    t_known[t_known_next++ % kKnownAllocations].id = id;
  }
  *out = std::move(id);
  if (offset != nullptr) *offset = p - base;
  return ClientStatus::Ok();
}

RetainedAllocation::RetainedAllocation(RetainedAllocation&& o) noexcept
    : driver_(std::exchange(o.driver_, nullptr)), handle_(o.handle_) {}

RetainedAllocation& RetainedAllocation::operator=(
    RetainedAllocation&& o) noexcept {
  if (this != &o) {
    Reset();
    driver_ = std::exchange(o.driver_, nullptr);
    handle_ = o.handle_;
  }
  return *this;
}

void RetainedAllocation::Reset() {
  if (driver_ != nullptr) driver_->cuMemRelease(handle_);
  driver_ = nullptr;
}

ClientStatus ExportBuffer(const cu::CudaDriver* driver, const void* ptr,
                          ExportedBuffer* out) {
  ExportedBuffer e;
  KREG_RETURN_IF_ERROR(IdentifyBuffer(driver, ptr, &e.id, &e.offset));
  const cu::CudaDriver& d = *driver;
  void* base = reinterpret_cast<void*>(static_cast<uintptr_t>(e.id.base));

  // VMM: retain the allocation and export it as a POSIX fd.
  std::string vmm_reason;
  cu::CUmemGenericAllocationHandle handle = 0;
  cu::CUresult r = d.cuMemRetainAllocationHandle(&handle, base);
  if (r == cu::CUDA_SUCCESS) {
    RetainedAllocation retained(driver, handle);
    cu::CUmemAllocationProp prop{};
    r = d.cuMemGetAllocationPropertiesFromHandle(&prop, handle);
    if (r != cu::CUDA_SUCCESS) {
      vmm_reason = "cuMemGetAllocationPropertiesFromHandle: " + Describe(d, r);
    } else if ((prop.requestedHandleTypes &
                cu::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
      vmm_reason =
          "the VMM allocation was not created exportable as a POSIX "
          "fd (requestedHandleTypes " +
          std::to_string(prop.requestedHandleTypes) + ")";
    } else {
      int fd = -1;
      r = d.cuMemExportToShareableHandle(
          &fd, handle, cu::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      if (r == cu::CUDA_SUCCESS) {
        e.kind = ExportKind::kVmmFd;
        e.fd = UniqueFd(fd);
        e.retained = std::move(retained);
        *out = std::move(e);
        return ClientStatus::Ok();
      }
      vmm_reason = "cuMemExportToShareableHandle: " + Describe(d, r);
    }
  } else {
    vmm_reason = "cuMemRetainAllocationHandle: " + Describe(d, r);
  }

  // Legacy IPC, in the context that owns the pointer.
  cu::CUcontext ctx = nullptr;
  cu::CUpointer_attribute attr = cu::CU_POINTER_ATTRIBUTE_CONTEXT;
  void* attr_data[] = {&ctx};
  d.cuPointerGetAttributes(1, &attr, attr_data, e.id.base);
  {
    PushContext push(d, ctx);
    r = d.cuIpcGetMemHandle(&e.ipc_handle, e.id.base);
  }
  if (r == cu::CUDA_SUCCESS) {
    e.kind = ExportKind::kLegacyIpc;
    *out = std::move(e);
    return ClientStatus::Ok();
  }
  e.kind = ExportKind::kNeedsStaging;
  e.staging_reason = "CUDA allocation at " + Hex(e.id.base) + " (" +
                     std::to_string(e.id.size) +
                     " bytes) cannot be shared: " + vmm_reason +
                     "; cuIpcGetMemHandle: " + Describe(d, r);
  *out = std::move(e);
  return ClientStatus::Ok();
}

}  // namespace kreg::cuda_client
