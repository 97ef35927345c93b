// The CUDA driver API as a table of function pointers resolved from
// libcuda.so.1 at run time (dlopen + dlsym), so that kregd and the client
// shim link and run on machines without a GPU or a driver. libc-only (no
// absl): shared by the daemon (//daemon/executor/cuda) and the shim
// (//client/shim/cuda).
//
// Tests build their own table of fakes (a CudaDriver is a plain struct) and
// hand it to the components instead of LoadCudaDriver()'s.
#ifndef KREGD_COMMON_CUDA_DRIVER_H_
#define KREGD_COMMON_CUDA_DRIVER_H_

#include <cstdint>
#include <string>

#include "common/cu_types.h"

namespace kreg::cu {

// Entry points by their cuda.h names; each is bound to the versioned symbol
// cuda.h maps the name to (cuMemGetAddressRange -> cuMemGetAddressRange_v2,
// ...). Stream functions are the legacy-default-stream variants; kregd never
// passes the null stream.
struct CudaDriver {
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuInit)(unsigned int);
  CUresult (*cuDriverGetVersion)(int*);
  // Devices and contexts.
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetName)(char*, int, CUdevice);
  CUresult (*cuDeviceGetUuid)(CUuuid*, CUdevice);
  CUresult (*cuDeviceGetAttribute)(int*, CUdevice_attribute, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
  CUresult (*cuCtxPushCurrent)(CUcontext);
  CUresult (*cuCtxPopCurrent)(CUcontext*);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuCtxGetDevice)(CUdevice*);
  // Optional (null on drivers older than CUDA 12.5): a context of one's own
  // (cuCtxCreate_v4 with no create params), beside the primary one.
  CUresult (*cuCtxCreate)(CUcontext*, void* params, unsigned int flags,
                          CUdevice);
  CUresult (*cuCtxDestroy)(CUcontext);
  // Optional (null where the driver lacks it): a context's ID, unique for
  // the life of the process (what StreamDevice caches a device by).
  CUresult (*cuCtxGetId)(CUcontext, unsigned long long*);  // NOLINT
  // Streams and events.
  CUresult (*cuStreamCreate)(CUstream*, unsigned int);
  CUresult (*cuStreamDestroy)(CUstream);
  CUresult (*cuStreamQuery)(CUstream);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned int);
  CUresult (*cuStreamGetCtx)(CUstream, CUcontext*);
  // Stream memory operations (the doorbell, DESIGN §3).
  CUresult (*cuStreamWaitValue64)(CUstream, CUdeviceptr, uint64_t,
                                  unsigned int);
  CUresult (*cuStreamWriteValue64)(CUstream, CUdeviceptr, uint64_t,
                                   unsigned int);
  CUresult (*cuEventCreate)(CUevent*, unsigned int);
  CUresult (*cuEventDestroy)(CUevent);
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventQuery)(CUevent);
  CUresult (*cuEventSynchronize)(CUevent);
  // Legacy IPC.
  CUresult (*cuIpcGetEventHandle)(CUipcEventHandle*, CUevent);
  CUresult (*cuIpcOpenEventHandle)(CUevent*, CUipcEventHandle);
  CUresult (*cuIpcGetMemHandle)(CUipcMemHandle*, CUdeviceptr);
  CUresult (*cuIpcOpenMemHandle)(CUdeviceptr*, CUipcMemHandle, unsigned int);
  CUresult (*cuIpcCloseMemHandle)(CUdeviceptr);
  // Pointers.
  CUresult (*cuMemGetAddressRange)(CUdeviceptr*, size_t*, CUdeviceptr);
  CUresult (*cuPointerGetAttributes)(unsigned int, CUpointer_attribute*, void**,
                                     CUdeviceptr);
  // Virtual memory management.
  CUresult (*cuMemCreate)(CUmemGenericAllocationHandle*, size_t,
                          const CUmemAllocationProp*, unsigned long long);
  CUresult (*cuMemRelease)(CUmemGenericAllocationHandle);
  CUresult (*cuMemRetainAllocationHandle)(CUmemGenericAllocationHandle*, void*);
  CUresult (*cuMemExportToShareableHandle)(void*, CUmemGenericAllocationHandle,
                                           CUmemAllocationHandleType,
                                           unsigned long long);
  CUresult (*cuMemImportFromShareableHandle)(CUmemGenericAllocationHandle*,
                                             void*, CUmemAllocationHandleType);
  CUresult (*cuMemGetAllocationPropertiesFromHandle)(
      CUmemAllocationProp*, CUmemGenericAllocationHandle);
  CUresult (*cuMemGetAllocationGranularity)(size_t*, const CUmemAllocationProp*,
                                            CUmemAllocationGranularity_flags);
  CUresult (*cuMemAddressReserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr,
                                  unsigned long long);
  CUresult (*cuMemAddressFree)(CUdeviceptr, size_t);
  CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t,
                       CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*cuMemUnmap)(CUdeviceptr, size_t);
  CUresult (*cuMemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc*,
                             size_t);
  // Stream-ordered allocation and copies.
  CUresult (*cuMemAllocAsync)(CUdeviceptr*, size_t, CUstream);
  CUresult (*cuMemFreeAsync)(CUdeviceptr, CUstream);
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream);
};

// The process's table for libcuda.so.1, loaded on first use and never
// unloaded. Null if the library or one of its symbols is missing; then
// *error (if given) says which, e.g. `no CUDA driver: dlopen("libcuda.so.1")
// failed: libcuda.so.1: cannot open shared object file: ...`. Thread-safe.
const CudaDriver* LoadCudaDriver(std::string* error = nullptr);

// Loads the library at `path` into a new table (never unloaded); the caller
// owns the table. Null with *error set as above. For tests and tools.
const CudaDriver* LoadCudaDriverFrom(const char* path, std::string* error);

// "CUDA_ERROR_ILLEGAL_ADDRESS (700): an illegal memory access was
// encountered"; "CUresult <n>" when the driver does not know the code.
std::string DescribeCuResult(const CudaDriver& driver, CUresult result);

// Whether `result` is a sticky error: the context that raised it is corrupt
// and every later call in it fails (illegal address, launch failure, device
// assert, uncorrectable ECC, ...). The process must be restarted to use the
// device again.
bool IsStickyCuError(CUresult result);

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints a UUID.
std::string FormatCuUuid(const CUuuid& uuid);

// The value to write to release every cuStreamWaitValue64(GEQ) wait for a
// sequence number up to `last` (from the same counter): GEQ compares
// cyclically, (int64_t)(*addr - value) >= 0, so UINT64_MAX would read as -1
// and release nothing.
inline uint64_t ReleaseValue(uint64_t last) { return last + (1ull << 62); }

}  // namespace kreg::cu

#endif  // KREGD_COMMON_CUDA_DRIVER_H_
