#include "tests/testing/fake_cuda.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <stdexcept>

namespace kreg::testing {
namespace {

using namespace kreg::cu;  // NOLINT: the fake speaks cuda.h's names

FakeCuda* g_fake = nullptr;
thread_local std::vector<CUcontext> t_stack;

CUcontext ContextOf(int ordinal) {
  return reinterpret_cast<CUcontext>(static_cast<uintptr_t>(0x1000 + ordinal));
}

uint64_t HandleId(const char* reserved) {
  uint64_t id;
  std::memcpy(&id, reserved, sizeof(id));
  return id;
}

#define FAKE_ENTER(fn)                \
  FakeCuda& f = *FakeCuda::current(); \
  f.calls.push_back(fn);              \
  if (CUresult injected; f.ShouldFail(fn, &injected)) return injected

// CU_POINTER_ATTRIBUTE_BUFFER_ID: unique in the process, as the driver's
// (the client caches identifications by it, across FakeCuda instances).
uint64_t NextBufferId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

bool ValidDevice(const FakeCuda& f, int d) {
  return d >= 0 && d < static_cast<int>(f.devices.size());
}

bool HasContext() { return !t_stack.empty() && t_stack.back() != nullptr; }

CUresult GetErrorName(CUresult r, const char** out) {
  switch (r) {
    case CUDA_SUCCESS:
      *out = "CUDA_SUCCESS";
      return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_VALUE:
      *out = "CUDA_ERROR_INVALID_VALUE";
      return CUDA_SUCCESS;
    case CUDA_ERROR_OUT_OF_MEMORY:
      *out = "CUDA_ERROR_OUT_OF_MEMORY";
      return CUDA_SUCCESS;
    case CUDA_ERROR_NO_DEVICE:
      *out = "CUDA_ERROR_NO_DEVICE";
      return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_HANDLE:
      *out = "CUDA_ERROR_INVALID_HANDLE";
      return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_SUPPORTED:
      *out = "CUDA_ERROR_NOT_SUPPORTED";
      return CUDA_SUCCESS;
    case CUDA_ERROR_ILLEGAL_ADDRESS:
      *out = "CUDA_ERROR_ILLEGAL_ADDRESS";
      return CUDA_SUCCESS;
    case CUDA_ERROR_LAUNCH_FAILED:
      *out = "CUDA_ERROR_LAUNCH_FAILED";
      return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_READY:
      *out = "CUDA_ERROR_NOT_READY";
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult GetErrorString(CUresult r, const char** out) {
  switch (r) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
      *out = "an illegal memory access was encountered";
      return CUDA_SUCCESS;
    case CUDA_ERROR_NO_DEVICE:
      *out = "no CUDA-capable device is detected";
      return CUDA_SUCCESS;
    case CUDA_ERROR_OUT_OF_MEMORY:
      *out = "out of memory";
      return CUDA_SUCCESS;
    default:
      *out = "fake error";
      return CUDA_SUCCESS;
  }
}

CUresult Init(unsigned int) {
  FAKE_ENTER("cuInit");
  return f.init_result;
}
CUresult DriverGetVersion(int* v) {
  *v = 13000;
  return CUDA_SUCCESS;
}
CUresult DeviceGetCount(int* n) {
  FAKE_ENTER("cuDeviceGetCount");
  *n = static_cast<int>(f.devices.size());
  return CUDA_SUCCESS;
}
CUresult DeviceGet(CUdevice* d, int ordinal) {
  FAKE_ENTER("cuDeviceGet");
  if (!ValidDevice(f, ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}
CUresult DeviceGetName(char* name, int len, CUdevice d) {
  FakeCuda& f = *FakeCuda::current();
  if (!ValidDevice(f, d)) return CUDA_ERROR_INVALID_DEVICE;
  std::strncpy(name, f.devices[d].name.c_str(), len);
  return CUDA_SUCCESS;
}
CUresult DeviceGetUuid(CUuuid* uuid, CUdevice d) {
  FAKE_ENTER("cuDeviceGetUuid");
  if (!ValidDevice(f, d)) return CUDA_ERROR_INVALID_DEVICE;
  std::memcpy(uuid->bytes, f.devices[d].uuid.data(), 16);
  return CUDA_SUCCESS;
}
CUresult DeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d) {
  FakeCuda& f = *FakeCuda::current();
  if (!ValidDevice(f, d)) return CUDA_ERROR_INVALID_DEVICE;
  const FakeCuda::Device& dev = f.devices[d];
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      *v = 9;
      break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      *v = 0;
      break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
      *v = dev.vmm;
      break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
      *v = dev.posix_fd;
      break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
      *v = dev.memory_pools;
      break;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS:
      *v = dev.memops64;
      break;
    default:
      *v = 0;
  }
  return CUDA_SUCCESS;
}
CUresult PrimaryCtxRetain(CUcontext* ctx, CUdevice d) {
  FAKE_ENTER("cuDevicePrimaryCtxRetain");
  if (!ValidDevice(f, d)) return CUDA_ERROR_INVALID_DEVICE;
  *ctx = ContextOf(d);
  ++f.retained_contexts;
  return CUDA_SUCCESS;
}
CUresult PrimaryCtxRelease(CUdevice d) {
  FAKE_ENTER("cuDevicePrimaryCtxRelease");
  --f.retained_contexts;
  return CUDA_SUCCESS;
}
CUresult CtxPush(CUcontext ctx) {
  FAKE_ENTER("cuCtxPushCurrent");
  t_stack.push_back(ctx);
  return CUDA_SUCCESS;
}
CUresult CtxPop(CUcontext* ctx) {
  if (t_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  *ctx = t_stack.back();
  t_stack.pop_back();
  return CUDA_SUCCESS;
}
CUresult CtxGetCurrent(CUcontext* ctx) {
  *ctx = t_stack.empty() ? nullptr : t_stack.back();
  return CUDA_SUCCESS;
}
CUresult CtxGetDevice(CUdevice* d) {
  if (!HasContext()) return CUDA_ERROR_INVALID_CONTEXT;
  // Primary contexts are 0x1000 + ordinal; created ones add 0x10000 * n.
  *d = static_cast<CUdevice>(
      (reinterpret_cast<uintptr_t>(t_stack.back()) - 0x1000) & 0xffff);
  return CUDA_SUCCESS;
}
CUresult CtxGetId(CUcontext ctx, unsigned long long* id) {  // NOLINT
  FAKE_ENTER("cuCtxGetId");
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *id = ((f.serial() * 1000 + f.context_epoch) << 32) |
        (reinterpret_cast<uintptr_t>(ctx) & 0xffffffffu);
  return CUDA_SUCCESS;
}
CUresult CtxCreate(CUcontext* ctx, void* params, unsigned int flags,
                   CUdevice dev) {
  FAKE_ENTER("cuCtxCreate");
  if (params != nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  ++f.contexts_created;
  ++f.contexts_live;
  *ctx = reinterpret_cast<CUcontext>(
      static_cast<uintptr_t>(0x1000 + dev + 0x10000 * f.contexts_created));
  t_stack.push_back(*ctx);  // cuCtxCreate makes it current
  return CUDA_SUCCESS;
}
CUresult CtxDestroy(CUcontext ctx) {
  FAKE_ENTER("cuCtxDestroy");
  --f.contexts_live;
  if (!t_stack.empty() && t_stack.back() == ctx) t_stack.pop_back();
  return CUDA_SUCCESS;
}

CUresult StreamCreate(CUstream* s, unsigned int flags) {
  FAKE_ENTER("cuStreamCreate");
  if (!HasContext()) return CUDA_ERROR_INVALID_CONTEXT;
  if (flags != CU_STREAM_NON_BLOCKING) return CUDA_ERROR_INVALID_VALUE;
  *s =
      reinterpret_cast<CUstream>(static_cast<uintptr_t>(0x2000 + f.next_id_++));
  ++f.live_streams;
  return CUDA_SUCCESS;
}
CUresult StreamDestroy(CUstream) {
  FAKE_ENTER("cuStreamDestroy");
  --f.live_streams;
  return CUDA_SUCCESS;
}
CUresult StreamQuery(CUstream) {
  FAKE_ENTER("cuStreamQuery");
  if (f.stream_query_result != CUDA_SUCCESS) return f.stream_query_result;
  return f.completed_ == f.enqueued_ ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
CUresult StreamSynchronize(CUstream) {
  FAKE_ENTER("cuStreamSynchronize");
  ++f.stream_syncs;
  f.CompleteAll();
  return CUDA_SUCCESS;
}
CUresult StreamWaitEvent(CUstream, CUevent e, unsigned int) {
  FAKE_ENTER("cuStreamWaitEvent");
  auto it = f.events_.find(e);
  if (it == f.events_.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (it->second.name != "fence")
    f.event_log.push_back("wait " + it->second.name);
  ++f.enqueued_;
  return CUDA_SUCCESS;
}
CUresult StreamGetCtx(CUstream, CUcontext* ctx) {
  FAKE_ENTER("cuStreamGetCtx");
  *ctx = ContextOf(0);
  return CUDA_SUCCESS;
}
CUresult StreamWaitValue64(CUstream s, CUdeviceptr addr, uint64_t value,
                           unsigned int flags) {
  FAKE_ENTER("cuStreamWaitValue64");
  if (!HasContext()) return CUDA_ERROR_INVALID_CONTEXT;
  if (flags != CU_STREAM_WAIT_VALUE_GEQ || addr % 8 != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  f.memops.push_back(FakeCuda::MemOp{
      false, s, addr, value, t_stack.empty() ? nullptr : t_stack.back()});
  ++f.enqueued_;
  return CUDA_SUCCESS;
}
CUresult StreamWriteValue64(CUstream s, CUdeviceptr addr, uint64_t value,
                            unsigned int flags) {
  FAKE_ENTER("cuStreamWriteValue64");
  if (!HasContext()) return CUDA_ERROR_INVALID_CONTEXT;
  if (flags != CU_STREAM_WRITE_VALUE_DEFAULT || addr % 8 != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  f.memops.push_back(FakeCuda::MemOp{
      true, s, addr, value, t_stack.empty() ? nullptr : t_stack.back()});
  f.memory_[addr] = value;
  ++f.enqueued_;
  return CUDA_SUCCESS;
}
CUresult EventCreate(CUevent* e, unsigned int flags) {
  FAKE_ENTER("cuEventCreate");
  if (!HasContext()) return CUDA_ERROR_INVALID_CONTEXT;
  if ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *e = reinterpret_cast<CUevent>(static_cast<uintptr_t>(0x3000 + f.next_id_++));
  // The fences kregd makes are not logged; this process's own
  // interprocess events are, as "local-ipc".
  f.events_[*e] = FakeCuda::Event{
      0, (flags & CU_EVENT_INTERPROCESS) ? "local-ipc" : "fence"};
  f.event_flags_[*e] = flags;
  ++f.live_events;
  return CUDA_SUCCESS;
}
CUresult EventDestroy(CUevent e) {
  FAKE_ENTER("cuEventDestroy");
  if (f.events_.erase(e) == 0) return CUDA_ERROR_INVALID_HANDLE;
  f.event_flags_.erase(e);
  --f.live_events;
  return CUDA_SUCCESS;
}
CUresult EventRecord(CUevent e, CUstream) {
  FAKE_ENTER("cuEventRecord");
  auto it = f.events_.find(e);
  if (it == f.events_.end()) return CUDA_ERROR_INVALID_HANDLE;
  it->second.recorded_at = f.enqueued_;
  if (it->second.name != "fence")
    f.event_log.push_back("record " + it->second.name);
  return CUDA_SUCCESS;
}
CUresult EventQuery(CUevent e) {
  FAKE_ENTER("cuEventQuery");
  auto it = f.events_.find(e);
  if (it == f.events_.end()) return CUDA_ERROR_INVALID_HANDLE;
  return it->second.recorded_at <= f.completed_ ? CUDA_SUCCESS
                                                : CUDA_ERROR_NOT_READY;
}
CUresult EventSynchronize(CUevent e) {
  FAKE_ENTER("cuEventSynchronize");
  auto it = f.events_.find(e);
  if (it == f.events_.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (f.completed_ < it->second.recorded_at)
    f.completed_ = it->second.recorded_at;
  return CUDA_SUCCESS;
}
CUresult IpcGetEventHandle(CUipcEventHandle* h, CUevent e) {
  FAKE_ENTER("cuIpcGetEventHandle");
  auto it = f.event_flags_.find(e);
  if (it == f.event_flags_.end() || !(it->second & CU_EVENT_INTERPROCESS)) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  *h = f.IpcEvent();
  return CUDA_SUCCESS;
}
CUresult IpcOpenEventHandle(CUevent* e, CUipcEventHandle h) {
  FAKE_ENTER("cuIpcOpenEventHandle");
  if (!HasContext()) return CUDA_ERROR_INVALID_CONTEXT;
  auto it = f.ipc_events_.find(HandleId(h.reserved));
  if (it == f.ipc_events_.end()) return CUDA_ERROR_INVALID_VALUE;
  *e = reinterpret_cast<CUevent>(static_cast<uintptr_t>(0x3000 + f.next_id_++));
  f.events_[*e] = FakeCuda::Event{0, it->second};
  ++f.live_events;
  return CUDA_SUCCESS;
}
CUresult IpcGetMemHandle(CUipcMemHandle* h, CUdeviceptr p) {
  FAKE_ENTER("cuIpcGetMemHandle");
  if (!HasContext()) return CUDA_ERROR_INVALID_CONTEXT;
  uint64_t base = 0;
  const FakeCuda::ClientAlloc* a = f.FindClient(p, &base);
  if (a == nullptr || a->kind != FakeCuda::Kind::kCudaMalloc) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *h = f.IpcAllocation(a->size);
  return CUDA_SUCCESS;
}
CUresult IpcOpenMemHandle(CUdeviceptr* p, CUipcMemHandle h,
                          unsigned int flags) {
  FAKE_ENTER("cuIpcOpenMemHandle");
  if (!HasContext()) return CUDA_ERROR_INVALID_CONTEXT;
  if (flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
    return CUDA_ERROR_INVALID_VALUE;
  auto it = f.ipc_allocs_.find(HandleId(h.reserved));
  if (it == f.ipc_allocs_.end()) return CUDA_ERROR_INVALID_VALUE;
  *p = f.next_va_;
  f.next_va_ += (it->second.size + 0xfffff) & ~0xfffffull;
  f.ipc_opened_[*p] = it->second.size;
  ++f.live_ipc_opens;
  return CUDA_SUCCESS;
}
CUresult IpcCloseMemHandle(CUdeviceptr p) {
  FAKE_ENTER("cuIpcCloseMemHandle");
  if (f.ipc_opened_.erase(p) == 0) return CUDA_ERROR_INVALID_VALUE;
  --f.live_ipc_opens;
  return CUDA_SUCCESS;
}
CUresult MemGetAddressRange(CUdeviceptr* base, size_t* size, CUdeviceptr p) {
  FAKE_ENTER("cuMemGetAddressRange");
  uint64_t client_base = 0;
  if (const FakeCuda::ClientAlloc* a = f.FindClient(p, &client_base)) {
    if (!HasContext()) return CUDA_ERROR_INVALID_CONTEXT;
    *base = client_base;
    *size = a->size;
    return CUDA_SUCCESS;
  }
  for (const auto* m : {&f.ipc_opened_, &f.maps_, &f.pool_}) {
    for (const auto& [va, sz] : *m) {
      if (p >= va && p < va + sz) {
        *base = va;
        *size = sz;
        return CUDA_SUCCESS;
      }
    }
  }
  return CUDA_ERROR_NOT_FOUND;
}
CUresult PointerGetAttributes(unsigned int n, CUpointer_attribute* attrs,
                              void** data, CUdeviceptr p) {
  FAKE_ENTER("cuPointerGetAttributes");
  uint64_t base = 0;
  const FakeCuda::ClientAlloc* a = f.FindClient(p, &base);
  for (unsigned int i = 0; i < n; ++i) {
    switch (attrs[i]) {
      case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        *static_cast<unsigned long long*>(data[i]) = a ? a->buffer_id : 0;
        break;
      case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *static_cast<int*>(data[i]) = a ? a->ordinal : -2;
        break;
      case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *static_cast<unsigned int*>(data[i]) = a ? CU_MEMORYTYPE_DEVICE : 0;
        break;
      case CU_POINTER_ATTRIBUTE_CONTEXT:
        *static_cast<CUcontext*>(data[i]) = a ? ContextOf(a->ordinal) : nullptr;
        break;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  }
  return CUDA_SUCCESS;
}
CUresult MemCreate(CUmemGenericAllocationHandle* h, size_t size,
                   const CUmemAllocationProp* prop, unsigned long long) {
  FAKE_ENTER("cuMemCreate");
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      !ValidDevice(f, prop->location.id) || size % f.granularity != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *h = f.next_id_++;
  f.handles_[*h] = FakeCuda::Allocation{
      size, true, 0,
      (prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) !=
          0,
      true};
  ++f.live_handles;
  return CUDA_SUCCESS;
}
CUresult MemRelease(CUmemGenericAllocationHandle h) {
  FAKE_ENTER("cuMemRelease");
  if (f.handles_.erase(h) == 0) return CUDA_ERROR_INVALID_VALUE;
  --f.live_handles;
  return CUDA_SUCCESS;
}
CUresult MemRetain(CUmemGenericAllocationHandle* h, void* addr) {
  FAKE_ENTER("cuMemRetainAllocationHandle");
  uint64_t base = 0;
  const FakeCuda::ClientAlloc* a =
      f.FindClient(reinterpret_cast<uintptr_t>(addr), &base);
  if (a == nullptr || (a->kind != FakeCuda::Kind::kVmmPosixFd &&
                       a->kind != FakeCuda::Kind::kVmmNoExport)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *h = f.next_id_++;
  f.handles_[*h] = FakeCuda::Allocation{a->size, true, 0,
                                        a->kind == FakeCuda::Kind::kVmmPosixFd};
  ++f.live_handles;
  return CUDA_SUCCESS;
}
CUresult MemExport(void* out, CUmemGenericAllocationHandle h,
                   CUmemAllocationHandleType type, unsigned long long) {
  FAKE_ENTER("cuMemExportToShareableHandle");
  auto it = f.handles_.find(h);
  if (it == f.handles_.end() ||
      type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
      !it->second.posix_fd) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const uint64_t size = it->second.size;
  *static_cast<int*>(out) = f.ExportAllocation(size);
  return CUDA_SUCCESS;
}
CUresult MemImport(CUmemGenericAllocationHandle* h, void* os_handle,
                   CUmemAllocationHandleType type) {
  FAKE_ENTER("cuMemImportFromShareableHandle");
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const int fd = static_cast<int>(reinterpret_cast<uintptr_t>(os_handle));
  auto it = f.exported_.find(fd);
  if (it == f.exported_.end()) return CUDA_ERROR_INVALID_VALUE;
  *h = f.next_id_++;
  f.handles_[*h] = it->second;
  ++f.live_handles;
  return CUDA_SUCCESS;
}
CUresult MemGetProps(CUmemAllocationProp* prop,
                     CUmemGenericAllocationHandle h) {
  FAKE_ENTER("cuMemGetAllocationPropertiesFromHandle");
  auto it = f.handles_.find(h);
  if (it == f.handles_.end()) return CUDA_ERROR_INVALID_VALUE;
  *prop = CUmemAllocationProp{};
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->requestedHandleTypes =
      it->second.posix_fd ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : 0;
  prop->location.type =
      it->second.device_memory ? CU_MEM_LOCATION_TYPE_DEVICE : 2;
  prop->location.id = 7;  // the exporter's ordinal: meaningless here
  return CUDA_SUCCESS;
}
CUresult MemGetGranularity(size_t* g, const CUmemAllocationProp* prop,
                           CUmemAllocationGranularity_flags) {
  FAKE_ENTER("cuMemGetAllocationGranularity");
  if (!ValidDevice(f, prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
  *g = f.granularity;
  return CUDA_SUCCESS;
}
CUresult MemAddressReserve(CUdeviceptr* p, size_t size, size_t, CUdeviceptr,
                           unsigned long long) {
  FAKE_ENTER("cuMemAddressReserve");
  *p = f.next_va_;
  f.next_va_ += (size + 0xfffff) & ~0xfffffull;
  f.reservations_[*p] = size;
  ++f.live_reservations;
  return CUDA_SUCCESS;
}
CUresult MemAddressFree(CUdeviceptr p, size_t size) {
  FAKE_ENTER("cuMemAddressFree");
  auto it = f.reservations_.find(p);
  if (it == f.reservations_.end() || it->second != size) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (f.maps_.count(p)) return CUDA_ERROR_INVALID_VALUE;  // still mapped
  f.reservations_.erase(it);
  --f.live_reservations;
  return CUDA_SUCCESS;
}
CUresult MemMap(CUdeviceptr p, size_t size, size_t offset,
                CUmemGenericAllocationHandle h, unsigned long long) {
  FAKE_ENTER("cuMemMap");
  auto it = f.handles_.find(h);
  if (it == f.handles_.end() || offset != 0 || size > it->second.size ||
      !f.reservations_.count(p)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  f.maps_[p] = size;
  ++f.live_maps;
  if (it->second.created_here) {
    f.client_[p] = FakeCuda::ClientAlloc{it->second.posix_fd
                                             ? FakeCuda::Kind::kVmmPosixFd
                                             : FakeCuda::Kind::kVmmNoExport,
                                         size, 0, NextBufferId()};
  }
  return CUDA_SUCCESS;
}
CUresult MemUnmap(CUdeviceptr p, size_t size) {
  FAKE_ENTER("cuMemUnmap");
  auto it = f.maps_.find(p);
  if (it == f.maps_.end() || it->second != size)
    return CUDA_ERROR_INVALID_VALUE;
  f.maps_.erase(it);
  f.client_.erase(p);
  --f.live_maps;
  return CUDA_SUCCESS;
}
CUresult MemSetAccess(CUdeviceptr p, size_t, const CUmemAccessDesc* desc,
                      size_t count) {
  FAKE_ENTER("cuMemSetAccess");
  if (count != 1 || !f.maps_.count(p) ||
      desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      !ValidDevice(f, desc->location.id) ||
      desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
CUresult MemAllocAsync(CUdeviceptr* p, size_t size, CUstream) {
  FAKE_ENTER("cuMemAllocAsync");
  f.next_va_ = (f.next_va_ + f.pool_alignment - 1) & ~(f.pool_alignment - 1);
  *p = f.next_va_;
  f.next_va_ += size + f.pool_alignment;
  f.pool_[*p] = size;
  ++f.live_pool_allocs;
  ++f.enqueued_;
  return CUDA_SUCCESS;
}
CUresult MemFreeAsync(CUdeviceptr p, CUstream) {
  FAKE_ENTER("cuMemFreeAsync");
  if (f.pool_.erase(p) == 0) return CUDA_ERROR_INVALID_VALUE;
  --f.live_pool_allocs;
  ++f.enqueued_;
  return CUDA_SUCCESS;
}
CUresult MemcpyDtoDAsync(CUdeviceptr, CUdeviceptr, size_t, CUstream) {
  FAKE_ENTER("cuMemcpyDtoDAsync");
  ++f.enqueued_;
  return CUDA_SUCCESS;
}
// Reads 64-bit words written by memops (0 where none was written).
CUresult MemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t bytes, CUstream) {
  FAKE_ENTER("cuMemcpyDtoHAsync");
  if (!HasContext()) return CUDA_ERROR_INVALID_CONTEXT;
  if (bytes != sizeof(uint64_t)) return CUDA_ERROR_INVALID_VALUE;
  auto it = f.memory_.find(src);
  uint64_t v = it == f.memory_.end() ? 0 : it->second;
  memcpy(dst, &v, sizeof(v));
  ++f.enqueued_;
  return CUDA_SUCCESS;
}

#undef FAKE_ENTER

}  // namespace

void FakeCuda::EnableCtxCreate() {
  table_.cuCtxCreate = CtxCreate;
  table_.cuCtxDestroy = CtxDestroy;
}

FakeCuda::FakeCuda() {
  if (g_fake != nullptr) throw std::logic_error("one FakeCuda at a time");
  g_fake = this;
  static std::atomic<uint64_t> instances{0};
  serial_ = ++instances;
  devices.push_back(Device{Uuid(0xa0)});
  table_.cuGetErrorName = GetErrorName;
  table_.cuGetErrorString = GetErrorString;
  table_.cuInit = Init;
  table_.cuDriverGetVersion = DriverGetVersion;
  table_.cuDeviceGetCount = DeviceGetCount;
  table_.cuDeviceGet = DeviceGet;
  table_.cuDeviceGetName = DeviceGetName;
  table_.cuDeviceGetUuid = DeviceGetUuid;
  table_.cuDeviceGetAttribute = DeviceGetAttribute;
  table_.cuDevicePrimaryCtxRetain = PrimaryCtxRetain;
  table_.cuDevicePrimaryCtxRelease = PrimaryCtxRelease;
  table_.cuCtxPushCurrent = CtxPush;
  table_.cuCtxPopCurrent = CtxPop;
  table_.cuCtxGetCurrent = CtxGetCurrent;
  table_.cuCtxGetDevice = CtxGetDevice;
  table_.cuCtxGetId = CtxGetId;
  table_.cuStreamCreate = StreamCreate;
  table_.cuStreamDestroy = StreamDestroy;
  table_.cuStreamQuery = StreamQuery;
  table_.cuStreamSynchronize = StreamSynchronize;
  table_.cuStreamWaitEvent = StreamWaitEvent;
  table_.cuStreamGetCtx = StreamGetCtx;
  table_.cuStreamWaitValue64 = StreamWaitValue64;
  table_.cuStreamWriteValue64 = StreamWriteValue64;
  table_.cuEventCreate = EventCreate;
  table_.cuEventDestroy = EventDestroy;
  table_.cuEventRecord = EventRecord;
  table_.cuEventQuery = EventQuery;
  table_.cuEventSynchronize = EventSynchronize;
  table_.cuIpcGetEventHandle = IpcGetEventHandle;
  table_.cuIpcOpenEventHandle = IpcOpenEventHandle;
  table_.cuIpcGetMemHandle = IpcGetMemHandle;
  table_.cuIpcOpenMemHandle = IpcOpenMemHandle;
  table_.cuIpcCloseMemHandle = IpcCloseMemHandle;
  table_.cuMemGetAddressRange = MemGetAddressRange;
  table_.cuPointerGetAttributes = PointerGetAttributes;
  table_.cuMemCreate = MemCreate;
  table_.cuMemRelease = MemRelease;
  table_.cuMemRetainAllocationHandle = MemRetain;
  table_.cuMemExportToShareableHandle = MemExport;
  table_.cuMemImportFromShareableHandle = MemImport;
  table_.cuMemGetAllocationPropertiesFromHandle = MemGetProps;
  table_.cuMemGetAllocationGranularity = MemGetGranularity;
  table_.cuMemAddressReserve = MemAddressReserve;
  table_.cuMemAddressFree = MemAddressFree;
  table_.cuMemMap = MemMap;
  table_.cuMemUnmap = MemUnmap;
  table_.cuMemSetAccess = MemSetAccess;
  table_.cuMemAllocAsync = MemAllocAsync;
  table_.cuMemFreeAsync = MemFreeAsync;
  table_.cuMemcpyDtoDAsync = MemcpyDtoDAsync;
  table_.cuMemcpyDtoHAsync = MemcpyDtoHAsync;
}

FakeCuda::~FakeCuda() {
  // Close the exported fds the code under test did not consume (an fd number
  // may have been reused since: compare inodes).
  for (const auto& [fd, alloc] : exported_) {
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_ino == alloc.inode) ::close(fd);
  }
  g_fake = nullptr;
}

FakeCuda* FakeCuda::current() { return g_fake; }

int FakeCuda::PushedDepth() { return static_cast<int>(t_stack.size()); }

bool FakeCuda::ShouldFail(const char* fn, cu::CUresult* r) {
  auto it = fail_next_.find(fn);
  if (it == fail_next_.end()) return false;
  *r = it->second;
  fail_next_.erase(it);
  return true;
}

int FakeCuda::ExportAllocation(uint64_t size, bool device_memory) {
  int fd = memfd_create("fake-cuda-export", MFD_CLOEXEC);
  if (fd < 0) throw std::runtime_error("memfd_create failed");
  struct stat st;
  fstat(fd, &st);
  exported_[fd] =
      Allocation{size, device_memory, static_cast<uint64_t>(st.st_ino), true};
  return fd;
}

cu::CUipcMemHandle FakeCuda::IpcAllocation(uint64_t size) {
  cu::CUipcMemHandle h{};
  const uint64_t id = next_id_++;
  std::memcpy(h.reserved, &id, sizeof(id));
  ipc_allocs_[id] = Allocation{size, true, 0, false};
  return h;
}

uint64_t FakeCuda::ClientAllocation(Kind kind, uint64_t size, int ordinal) {
  const uint64_t base = next_va_;
  next_va_ += (size + 0xfffff) & ~0xfffffull;
  client_[base] = ClientAlloc{kind, size, ordinal, NextBufferId()};
  return base;
}

const FakeCuda::ClientAlloc* FakeCuda::FindClient(uint64_t p,
                                                  uint64_t* base) const {
  auto it = client_.upper_bound(p);
  if (it == client_.begin()) return nullptr;
  --it;
  if (p >= it->first + it->second.size) return nullptr;
  *base = it->first;
  return &it->second;
}

cu::CUipcEventHandle FakeCuda::IpcEvent() {
  cu::CUipcEventHandle h{};
  const uint64_t id = next_id_++;
  std::memcpy(h.reserved, &id, sizeof(id));
  ipc_events_[id] = "event" + std::to_string(ipc_events_.size());
  return h;
}

}  // namespace kreg::testing
