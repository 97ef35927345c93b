// The subset of the CUDA driver API's types and constants kregd uses, declared
// here so that kregd and the client shim build without the CUDA toolkit and
// load libcuda.so.1 only at run time (cuda_driver.h). Values and layouts are
// those of cuda.h (CUDA 12/13; they are part of the driver's stable ABI);
// tests/common/cu_types_abi_test.cc checks them against cuda.h whenever the
// toolkit is present.
//
// Names are cuda.h's, inside namespace kreg::cu. The opaque handle structs are
// declared globally, as cuda.h does, so a CUstream here is the very type of a
// cudaStream_t.
#ifndef KREGD_COMMON_CU_TYPES_H_
#define KREGD_COMMON_CU_TYPES_H_

#include <cstddef>
#include <cstdint>

struct CUctx_st;
struct CUstream_st;
struct CUevent_st;

namespace kreg::cu {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;  // NOLINT: cuda.h's type
using CUmemGenericAllocationHandle = unsigned long long;  // NOLINT
using CUcontext = ::CUctx_st*;
using CUstream = ::CUstream_st*;
using CUevent = ::CUevent_st*;

// CUresult values kregd tells apart.
inline constexpr CUresult CUDA_SUCCESS = 0;
inline constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
inline constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
inline constexpr CUresult CUDA_ERROR_NOT_INITIALIZED = 3;
inline constexpr CUresult CUDA_ERROR_DEINITIALIZED = 4;
inline constexpr CUresult CUDA_ERROR_STUB_LIBRARY = 34;
inline constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
inline constexpr CUresult CUDA_ERROR_INVALID_DEVICE = 101;
inline constexpr CUresult CUDA_ERROR_INVALID_CONTEXT = 201;
inline constexpr CUresult CUDA_ERROR_ECC_UNCORRECTABLE = 214;
inline constexpr CUresult CUDA_ERROR_NVLINK_UNCORRECTABLE = 220;
inline constexpr CUresult CUDA_ERROR_CONTAINED = 226;
inline constexpr CUresult CUDA_ERROR_INVALID_HANDLE = 400;
inline constexpr CUresult CUDA_ERROR_NOT_FOUND = 500;
inline constexpr CUresult CUDA_ERROR_NOT_READY = 600;
inline constexpr CUresult CUDA_ERROR_ILLEGAL_ADDRESS = 700;
inline constexpr CUresult CUDA_ERROR_LAUNCH_TIMEOUT = 702;
inline constexpr CUresult CUDA_ERROR_CONTEXT_IS_DESTROYED = 709;
inline constexpr CUresult CUDA_ERROR_ASSERT = 710;
inline constexpr CUresult CUDA_ERROR_HARDWARE_STACK_ERROR = 714;
inline constexpr CUresult CUDA_ERROR_ILLEGAL_INSTRUCTION = 715;
inline constexpr CUresult CUDA_ERROR_MISALIGNED_ADDRESS = 716;
inline constexpr CUresult CUDA_ERROR_INVALID_ADDRESS_SPACE = 717;
inline constexpr CUresult CUDA_ERROR_INVALID_PC = 718;
inline constexpr CUresult CUDA_ERROR_LAUNCH_FAILED = 719;
inline constexpr CUresult CUDA_ERROR_TENSOR_MEMORY_LEAK = 721;
inline constexpr CUresult CUDA_ERROR_NOT_PERMITTED = 800;
inline constexpr CUresult CUDA_ERROR_NOT_SUPPORTED = 801;
inline constexpr CUresult CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803;
inline constexpr CUresult CUDA_ERROR_EXTERNAL_DEVICE = 911;
inline constexpr CUresult CUDA_ERROR_UNKNOWN = 999;

// cuda.h's CU_IPC_HANDLE_SIZE (a macro there, so not that name here).
inline constexpr size_t kCuIpcHandleSize = 64;

struct CUuuid {
  char bytes[16];
};
struct CUipcMemHandle {
  char reserved[kCuIpcHandleSize];
};
struct CUipcEventHandle {
  char reserved[kCuIpcHandleSize];
};

// Flags and enums (plain ints; cuda.h's enums are int-sized).
inline constexpr unsigned int CU_STREAM_NON_BLOCKING = 0x1;
inline constexpr unsigned int CU_EVENT_DISABLE_TIMING = 0x2;
inline constexpr unsigned int CU_EVENT_INTERPROCESS = 0x4;
inline constexpr unsigned int CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x1;

using CUmemAllocationHandleType = int;
inline constexpr CUmemAllocationHandleType CU_MEM_HANDLE_TYPE_NONE = 0x0;
inline constexpr CUmemAllocationHandleType
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1;

using CUmemAccess_flags = int;
inline constexpr CUmemAccess_flags CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3;

using CUmemLocationType = int;
inline constexpr CUmemLocationType CU_MEM_LOCATION_TYPE_DEVICE = 0x1;

using CUmemAllocationType = int;
inline constexpr CUmemAllocationType CU_MEM_ALLOCATION_TYPE_PINNED = 0x1;

using CUmemAllocationGranularity_flags = int;
inline constexpr CUmemAllocationGranularity_flags
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0;

using CUpointer_attribute = int;
inline constexpr CUpointer_attribute CU_POINTER_ATTRIBUTE_CONTEXT = 1;
inline constexpr CUpointer_attribute CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2;
inline constexpr CUpointer_attribute CU_POINTER_ATTRIBUTE_BUFFER_ID = 7;
inline constexpr CUpointer_attribute CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9;
inline constexpr CUpointer_attribute CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11;
inline constexpr CUpointer_attribute CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12;
inline constexpr CUpointer_attribute CU_POINTER_ATTRIBUTE_MAPPED = 13;
inline constexpr CUpointer_attribute CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES =
    14;

inline constexpr unsigned int CU_MEMORYTYPE_DEVICE = 0x2;

using CUdevice_attribute = int;
inline constexpr CUdevice_attribute
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
inline constexpr CUdevice_attribute
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
inline constexpr CUdevice_attribute
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102;
inline constexpr CUdevice_attribute
    CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103;
inline constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED =
    115;
// cuStreamWaitValue64/cuStreamWriteValue64 (the v2 memops; CUDA 12+).
inline constexpr CUdevice_attribute
    CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS = 122;

// Stream memory operations (CUstreamWaitValue_flags, CUstreamWriteValue_flags).
inline constexpr unsigned int CU_STREAM_WAIT_VALUE_GEQ = 0x0;
inline constexpr unsigned int CU_STREAM_WRITE_VALUE_DEFAULT = 0x0;

struct CUmemLocation {
  CUmemLocationType type;
  int id;
};

struct CUmemAllocationProp {
  CUmemAllocationType type;
  CUmemAllocationHandleType requestedHandleTypes;
  CUmemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;  // NOLINT: cuda.h's type
    unsigned char reserved[4];
  } allocFlags;
};

struct CUmemAccessDesc {
  CUmemLocation location;
  CUmemAccess_flags flags;
};

}  // namespace kreg::cu

#endif  // KREGD_COMMON_CU_TYPES_H_
