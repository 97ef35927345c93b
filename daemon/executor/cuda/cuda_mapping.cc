#include "daemon/executor/cuda/cuda_mapping.h"

#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

// `status` with `hint` appended to its message (same code).
absl::Status WithHint(const absl::Status& status, absl::string_view hint) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(status.message(), " ", hint));
}

// Logs (does not return) a failed release: nothing can be done about it.
void LogRelease(const cu::CudaDriver& d, cu::CUresult r, const char* what) {
  if (r != cu::CUDA_SUCCESS) {
    spdlog::warn("releasing a client CUDA mapping: {} failed: {}", what,
                 cu::DescribeCuResult(d, r));
  }
}

// The device the memory at kregd's address `p` lives on, as the driver
// answers for kregd's own numbering (CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL): a
// number, or why it is unknown.
std::string ResidentDevice(const cu::CudaDriver& d, cu::CUdeviceptr p) {
  if (d.cuPointerGetAttributes == nullptr) return "unknown";
  int ordinal = -1;
  cu::CUpointer_attribute attr = cu::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL;
  void* data[] = {&ordinal};
  cu::CUresult r = d.cuPointerGetAttributes(1, &attr, data, p);
  if (r != cu::CUDA_SUCCESS) {
    return absl::StrCat("unknown (", cu::DescribeCuResult(d, r), ")");
  }
  return absl::StrCat(ordinal);
}

// Debug log, one line when a client mapping is made and one when it is
// released (tests/gpu/test_multi_gpu.py reads them: the device each mapping
// was made for, the device the driver says the memory is on, and that every
// mapping is released). Nothing is computed below debug level.
void LogMapped(CudaDevices* devices, int ordinal, cu::CUdeviceptr base,
               uint64_t size, const char* kind) {
  if (!spdlog::should_log(spdlog::level::debug)) return;
  spdlog::debug(
      "CUDA mapping 0x{:x} (+{} bytes, {}) mapped on kregd device {} {}; "
      "driver: resident on device {}",
      base, size, kind, ordinal, devices->info(ordinal).uuid_text,
      ResidentDevice(*devices->driver(), base));
}

void LogReleased(CudaDevices* devices, int ordinal, cu::CUdeviceptr base,
                 uint64_t size) {
  if (!spdlog::should_log(spdlog::level::debug)) return;
  spdlog::debug(
      "CUDA mapping 0x{:x} (+{} bytes) on kregd device {} {} released", base,
      size, ordinal, devices->info(ordinal).uuid_text);
}

}  // namespace

absl::StatusOr<std::unique_ptr<VmmImport>> VmmImport::Import(
    CudaDevices* devices, int ordinal, UniqueFd fd, uint64_t size) {
  KREG_RETURN_IF_ERROR(devices->CheckUsable(ordinal));
  const CudaDeviceInfo& info = devices->info(ordinal);
  if (!info.vmm || !info.posix_fd) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA device ", info.uuid_text,
        " does not support importing VMM allocations as POSIX fds"));
  }
  if (size == 0) {
    return absl::InvalidArgumentError("a CUDA VMM mapping of 0 bytes");
  }
  if (!fd.ok()) {
    return absl::InvalidArgumentError(
        "no file descriptor came with the CUDA VMM mapping");
  }
  CudaContextScope scope(*devices, ordinal);
  if (!scope.status().ok()) return scope.status();
  const cu::CudaDriver& d = *devices->driver();
  std::unique_ptr<VmmImport> m(new VmmImport(devices, ordinal, size));

  cu::CUresult r = d.cuMemImportFromShareableHandle(
      &m->handle_, reinterpret_cast<void*>(static_cast<uintptr_t>(fd.get())),
      cu::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  fd.reset();  // The imported handle holds its own reference.
  if (r != cu::CUDA_SUCCESS) {
    return WithHint(
        devices->Check(ordinal, r, "cuMemImportFromShareableHandle"),
        "(the fd must come from cuMemExportToShareableHandle with "
        "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)");
  }
  m->imported_ = true;

  cu::CUmemAllocationProp prop{};
  r = d.cuMemGetAllocationPropertiesFromHandle(&prop, m->handle_);
  if (r != cu::CUDA_SUCCESS) {
    return devices->Check(ordinal, r, "cuMemGetAllocationPropertiesFromHandle");
  }
  if (prop.location.type != cu::CU_MEM_LOCATION_TYPE_DEVICE) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the imported CUDA allocation is not device memory (location type ",
        prop.location.type, ")"));
  }
  // The exporter's ordinal means nothing here: ask about kregd's device.
  prop.location.id = info.device;
  size_t granularity = 0;
  r = d.cuMemGetAllocationGranularity(&granularity, &prop,
                                      cu::CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (r != cu::CUDA_SUCCESS) {
    return devices->Check(ordinal, r, "cuMemGetAllocationGranularity");
  }
  if (granularity != 0 && size % granularity != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a CUDA VMM mapping of ", size,
                     " bytes is not a multiple of the allocation granularity ",
                     granularity));
  }

  r = d.cuMemAddressReserve(&m->base_, size, 0, 0, 0);
  if (r != cu::CUDA_SUCCESS) {
    m->base_ = 0;
    return devices->Check(
        ordinal, r, absl::StrCat("cuMemAddressReserve of ", size, " bytes"));
  }
  r = d.cuMemMap(m->base_, size, 0, m->handle_, 0);
  if (r != cu::CUDA_SUCCESS) {
    return WithHint(
        devices->Check(ordinal, r,
                       absl::StrCat("cuMemMap of ", size, " bytes")),
        "(is the size larger than the exported allocation?)");
  }
  m->mapped_ = true;
  cu::CUmemAccessDesc access{};
  access.location.type = cu::CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = info.device;
  access.flags = cu::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r = d.cuMemSetAccess(m->base_, size, &access, 1);
  if (r != cu::CUDA_SUCCESS) {
    return devices->Check(ordinal, r, "cuMemSetAccess");
  }
  m->complete_ = true;
  LogMapped(devices, ordinal, m->base_, size, "VMM import");
  return m;
}

VmmImport::~VmmImport() {
  // A broken device has no usable context; the VMM calls are still tried.
  CudaContextScope scope(*devices_, ordinal_);
  const cu::CudaDriver& d = *devices_->driver();
  if (mapped_) LogRelease(d, d.cuMemUnmap(base_, size_), "cuMemUnmap");
  if (base_ != 0) {
    LogRelease(d, d.cuMemAddressFree(base_, size_), "cuMemAddressFree");
  }
  if (imported_) LogRelease(d, d.cuMemRelease(handle_), "cuMemRelease");
  if (complete_) LogReleased(devices_, ordinal_, base_, size_);
}

absl::StatusOr<std::unique_ptr<IpcMemOpen>> IpcMemOpen::Open(
    CudaDevices* devices, int ordinal, const cu::CUipcMemHandle& handle,
    uint64_t size) {
  KREG_RETURN_IF_ERROR(devices->CheckUsable(ordinal));
  if (size == 0) {
    return absl::InvalidArgumentError("a CUDA IPC mapping of 0 bytes");
  }
  CudaContextScope scope(*devices, ordinal);
  if (!scope.status().ok()) return scope.status();
  const cu::CudaDriver& d = *devices->driver();
  cu::CUdeviceptr base = 0;
  cu::CUresult r = d.cuIpcOpenMemHandle(&base, handle,
                                        cu::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  if (r != cu::CUDA_SUCCESS) {
    return WithHint(devices->Check(ordinal, r, "cuIpcOpenMemHandle"),
                    "(the handle must come from cuIpcGetMemHandle of "
                    "cudaMalloc memory in another process)");
  }
  // Opens are reference counted per context, so every session closes its own.
  std::unique_ptr<IpcMemOpen> m(new IpcMemOpen(devices, ordinal, base, size));
  cu::CUdeviceptr range_base = 0;
  size_t range_size = 0;
  r = d.cuMemGetAddressRange(&range_base, &range_size, base);
  if (r != cu::CUDA_SUCCESS) {
    return devices->Check(ordinal, r, "cuMemGetAddressRange");
  }
  if (range_base != base || size > range_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a CUDA IPC mapping claims ", size, " bytes but its handle maps ",
        range_size, " bytes at offset ", base - range_base));
  }
  m->complete_ = true;
  LogMapped(devices, ordinal, base, size, "IPC open");
  return m;
}

IpcMemOpen::~IpcMemOpen() {
  CudaContextScope scope(*devices_, ordinal_);
  const cu::CudaDriver& d = *devices_->driver();
  LogRelease(d, d.cuIpcCloseMemHandle(base_), "cuIpcCloseMemHandle");
  if (complete_) LogReleased(devices_, ordinal_, base_, size_);
}

absl::StatusOr<std::unique_ptr<IpcEventOpen>> IpcEventOpen::Open(
    CudaDevices* devices, int ordinal, const cu::CUipcEventHandle& handle) {
  KREG_RETURN_IF_ERROR(devices->CheckUsable(ordinal));
  CudaContextScope scope(*devices, ordinal);
  if (!scope.status().ok()) return scope.status();
  cu::CUevent event = nullptr;
  cu::CUresult r = devices->driver()->cuIpcOpenEventHandle(&event, handle);
  if (r != cu::CUDA_SUCCESS) {
    return WithHint(devices->Check(ordinal, r, "cuIpcOpenEventHandle"),
                    "(the handle must come from cuIpcGetEventHandle of an "
                    "event created with CU_EVENT_INTERPROCESS)");
  }
  return std::unique_ptr<IpcEventOpen>(
      new IpcEventOpen(devices, ordinal, event));
}

IpcEventOpen::~IpcEventOpen() {
  CudaContextScope scope(*devices_, ordinal_);
  const cu::CudaDriver& d = *devices_->driver();
  LogRelease(d, d.cuEventDestroy(event_), "cuEventDestroy");
}

absl::Status IpcEventOpen::WaitOn(cu::CUstream stream) {
  return devices_->Check(
      ordinal_, devices_->driver()->cuStreamWaitEvent(stream, event_, 0),
      "cuStreamWaitEvent on the client's event");
}

absl::Status IpcEventOpen::RecordOn(cu::CUstream stream) {
  return devices_->Check(ordinal_,
                         devices_->driver()->cuEventRecord(event_, stream),
                         "cuEventRecord of the client's event");
}

}  // namespace kreg
