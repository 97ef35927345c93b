#include "common/cuda_driver.h"

#include <dlfcn.h>

#include <cstdio>
#include <mutex>

namespace kreg::cu {
namespace {

constexpr char kLibCuda[] = "libcuda.so.1";

// One entry per CudaDriver member: where it lives and the symbol it binds.
struct Entry {
  void** slot;
  const char* symbol;
};

#define KREG_CU_ENTRY(field, symbol) \
  Entry { reinterpret_cast<void**>(&d->field), symbol }

bool Resolve(void* lib, CudaDriver* d, const char* path, std::string* error) {
  const Entry entries[] = {
      KREG_CU_ENTRY(cuGetErrorName, "cuGetErrorName"),
      KREG_CU_ENTRY(cuGetErrorString, "cuGetErrorString"),
      KREG_CU_ENTRY(cuInit, "cuInit"),
      KREG_CU_ENTRY(cuDriverGetVersion, "cuDriverGetVersion"),
      KREG_CU_ENTRY(cuDeviceGetCount, "cuDeviceGetCount"),
      KREG_CU_ENTRY(cuDeviceGet, "cuDeviceGet"),
      KREG_CU_ENTRY(cuDeviceGetName, "cuDeviceGetName"),
      KREG_CU_ENTRY(cuDeviceGetUuid, "cuDeviceGetUuid_v2"),
      KREG_CU_ENTRY(cuDeviceGetAttribute, "cuDeviceGetAttribute"),
      KREG_CU_ENTRY(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
      KREG_CU_ENTRY(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
      KREG_CU_ENTRY(cuCtxPushCurrent, "cuCtxPushCurrent_v2"),
      KREG_CU_ENTRY(cuCtxPopCurrent, "cuCtxPopCurrent_v2"),
      KREG_CU_ENTRY(cuCtxGetCurrent, "cuCtxGetCurrent"),
      KREG_CU_ENTRY(cuCtxGetDevice, "cuCtxGetDevice"),
      KREG_CU_ENTRY(cuStreamCreate, "cuStreamCreate"),
      KREG_CU_ENTRY(cuStreamDestroy, "cuStreamDestroy_v2"),
      KREG_CU_ENTRY(cuStreamQuery, "cuStreamQuery"),
      KREG_CU_ENTRY(cuStreamSynchronize, "cuStreamSynchronize"),
      KREG_CU_ENTRY(cuStreamWaitEvent, "cuStreamWaitEvent"),
      KREG_CU_ENTRY(cuStreamGetCtx, "cuStreamGetCtx"),
      KREG_CU_ENTRY(cuStreamWaitValue64, "cuStreamWaitValue64_v2"),
      KREG_CU_ENTRY(cuStreamWriteValue64, "cuStreamWriteValue64_v2"),
      KREG_CU_ENTRY(cuEventCreate, "cuEventCreate"),
      KREG_CU_ENTRY(cuEventDestroy, "cuEventDestroy_v2"),
      KREG_CU_ENTRY(cuEventRecord, "cuEventRecord"),
      KREG_CU_ENTRY(cuEventQuery, "cuEventQuery"),
      KREG_CU_ENTRY(cuEventSynchronize, "cuEventSynchronize"),
      KREG_CU_ENTRY(cuIpcGetEventHandle, "cuIpcGetEventHandle"),
      KREG_CU_ENTRY(cuIpcOpenEventHandle, "cuIpcOpenEventHandle"),
      KREG_CU_ENTRY(cuIpcGetMemHandle, "cuIpcGetMemHandle"),
      KREG_CU_ENTRY(cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2"),
      KREG_CU_ENTRY(cuIpcCloseMemHandle, "cuIpcCloseMemHandle"),
      KREG_CU_ENTRY(cuMemGetAddressRange, "cuMemGetAddressRange_v2"),
      KREG_CU_ENTRY(cuPointerGetAttributes, "cuPointerGetAttributes"),
      KREG_CU_ENTRY(cuMemCreate, "cuMemCreate"),
      KREG_CU_ENTRY(cuMemRelease, "cuMemRelease"),
      KREG_CU_ENTRY(cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle"),
      KREG_CU_ENTRY(cuMemExportToShareableHandle,
                    "cuMemExportToShareableHandle"),
      KREG_CU_ENTRY(cuMemImportFromShareableHandle,
                    "cuMemImportFromShareableHandle"),
      KREG_CU_ENTRY(cuMemGetAllocationPropertiesFromHandle,
                    "cuMemGetAllocationPropertiesFromHandle"),
      KREG_CU_ENTRY(cuMemGetAllocationGranularity,
                    "cuMemGetAllocationGranularity"),
      KREG_CU_ENTRY(cuMemAddressReserve, "cuMemAddressReserve"),
      KREG_CU_ENTRY(cuMemAddressFree, "cuMemAddressFree"),
      KREG_CU_ENTRY(cuMemMap, "cuMemMap"),
      KREG_CU_ENTRY(cuMemUnmap, "cuMemUnmap"),
      KREG_CU_ENTRY(cuMemSetAccess, "cuMemSetAccess"),
      KREG_CU_ENTRY(cuMemAllocAsync, "cuMemAllocAsync"),
      KREG_CU_ENTRY(cuMemFreeAsync, "cuMemFreeAsync"),
      KREG_CU_ENTRY(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"),
      KREG_CU_ENTRY(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
  };
  // Optional entries: null when this driver lacks them.
  d->cuCtxCreate =
      reinterpret_cast<decltype(d->cuCtxCreate)>(dlsym(lib, "cuCtxCreate_v4"));
  d->cuCtxDestroy = reinterpret_cast<decltype(d->cuCtxDestroy)>(
      dlsym(lib, "cuCtxDestroy_v2"));
  d->cuCtxGetId =
      reinterpret_cast<decltype(d->cuCtxGetId)>(dlsym(lib, "cuCtxGetId"));
  if (d->cuCtxCreate == nullptr || d->cuCtxDestroy == nullptr) {
    d->cuCtxCreate = nullptr;
    d->cuCtxDestroy = nullptr;
  }
  for (const Entry& e : entries) {
    *e.slot = dlsym(lib, e.symbol);
    if (*e.slot == nullptr) {
      if (error != nullptr) {
        *error = std::string("CUDA driver too old: ") + path + " lacks " +
                 e.symbol + " (kregd needs a driver for CUDA 12.0 or newer)";
      }
      return false;
    }
  }
  return true;
}

#undef KREG_CU_ENTRY

}  // namespace

const CudaDriver* LoadCudaDriverFrom(const char* path, std::string* error) {
  // RTLD_LOCAL: the driver's symbols stay out of the global namespace, so
  // nothing the host process loads later can bind to them by accident.
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    if (error != nullptr) {
      const char* why = dlerror();
      *error = std::string("no CUDA driver: dlopen(\"") + path +
               "\") failed: " + (why != nullptr ? why : "unknown error");
    }
    return nullptr;
  }
  auto* driver = new CudaDriver{};
  if (!Resolve(lib, driver, path, error)) {
    delete driver;
    dlclose(lib);
    return nullptr;
  }
  return driver;  // Never unloaded: contexts and mappings outlive callers.
}

const CudaDriver* LoadCudaDriver(std::string* error) {
  static std::once_flag once;
  static const CudaDriver* driver = nullptr;
  static std::string* load_error = nullptr;
  std::call_once(once, [] {
    std::string why;
    driver = LoadCudaDriverFrom(kLibCuda, &why);
    if (driver == nullptr) load_error = new std::string(why);
  });
  if (driver == nullptr && error != nullptr) *error = *load_error;
  return driver;
}

std::string DescribeCuResult(const CudaDriver& driver, CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (driver.cuGetErrorName == nullptr ||
      driver.cuGetErrorName(result, &name) != CUDA_SUCCESS || name == nullptr) {
    return "CUresult " + std::to_string(result);
  }
  std::string out = std::string(name) + " (" + std::to_string(result) + ")";
  if (driver.cuGetErrorString != nullptr &&
      driver.cuGetErrorString(result, &text) == CUDA_SUCCESS &&
      text != nullptr) {
    out += std::string(": ") + text;
  }
  return out;
}

bool IsStickyCuError(CUresult result) {
  switch (result) {
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_NVLINK_UNCORRECTABLE:
    case CUDA_ERROR_CONTAINED:
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_TENSOR_MEMORY_LEAK:
    case CUDA_ERROR_EXTERNAL_DEVICE:
      return true;
    default:
      return false;
  }
}

std::string FormatCuUuid(const CUuuid& uuid) {
  char buf[64];
  const auto* b = reinterpret_cast<const unsigned char*>(uuid.bytes);
  std::snprintf(buf, sizeof(buf),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
                "%02x%02x%02x%02x%02x%02x",
                b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9],
                b[10], b[11], b[12], b[13], b[14], b[15]);
  return buf;
}

}  // namespace kreg::cu
