// cu_types.h declares the driver API's types and constants without cuda.h;
// this checks every one of them against the toolkit's cuda.h.
#include <cuda.h>

#include <cstddef>
#include <type_traits>

#include "catch2/catch.hpp"
#include "common/cu_types.h"

namespace {

namespace k = kreg::cu;

#define SAME_VALUE(name)                                                 \
  static_assert(                                                         \
      static_cast<long long>(k::name) == static_cast<long long>(::name), \
      #name)

SAME_VALUE(CUDA_SUCCESS);
SAME_VALUE(CUDA_ERROR_INVALID_VALUE);
SAME_VALUE(CUDA_ERROR_OUT_OF_MEMORY);
SAME_VALUE(CUDA_ERROR_NOT_INITIALIZED);
SAME_VALUE(CUDA_ERROR_DEINITIALIZED);
SAME_VALUE(CUDA_ERROR_STUB_LIBRARY);
SAME_VALUE(CUDA_ERROR_NO_DEVICE);
SAME_VALUE(CUDA_ERROR_INVALID_DEVICE);
SAME_VALUE(CUDA_ERROR_INVALID_CONTEXT);
SAME_VALUE(CUDA_ERROR_ECC_UNCORRECTABLE);
SAME_VALUE(CUDA_ERROR_NVLINK_UNCORRECTABLE);
SAME_VALUE(CUDA_ERROR_CONTAINED);
SAME_VALUE(CUDA_ERROR_INVALID_HANDLE);
SAME_VALUE(CUDA_ERROR_NOT_FOUND);
SAME_VALUE(CUDA_ERROR_NOT_READY);
SAME_VALUE(CUDA_ERROR_ILLEGAL_ADDRESS);
SAME_VALUE(CUDA_ERROR_LAUNCH_TIMEOUT);
SAME_VALUE(CUDA_ERROR_CONTEXT_IS_DESTROYED);
SAME_VALUE(CUDA_ERROR_ASSERT);
SAME_VALUE(CUDA_ERROR_HARDWARE_STACK_ERROR);
SAME_VALUE(CUDA_ERROR_ILLEGAL_INSTRUCTION);
SAME_VALUE(CUDA_ERROR_MISALIGNED_ADDRESS);
SAME_VALUE(CUDA_ERROR_INVALID_ADDRESS_SPACE);
SAME_VALUE(CUDA_ERROR_INVALID_PC);
SAME_VALUE(CUDA_ERROR_LAUNCH_FAILED);
SAME_VALUE(CUDA_ERROR_TENSOR_MEMORY_LEAK);
SAME_VALUE(CUDA_ERROR_NOT_PERMITTED);
SAME_VALUE(CUDA_ERROR_NOT_SUPPORTED);
SAME_VALUE(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH);
SAME_VALUE(CUDA_ERROR_EXTERNAL_DEVICE);
SAME_VALUE(CUDA_ERROR_UNKNOWN);
static_assert(k::kCuIpcHandleSize == CU_IPC_HANDLE_SIZE);
SAME_VALUE(CU_STREAM_NON_BLOCKING);
SAME_VALUE(CU_EVENT_DISABLE_TIMING);
SAME_VALUE(CU_EVENT_INTERPROCESS);
SAME_VALUE(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
SAME_VALUE(CU_MEM_HANDLE_TYPE_NONE);
SAME_VALUE(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
SAME_VALUE(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
SAME_VALUE(CU_MEM_LOCATION_TYPE_DEVICE);
SAME_VALUE(CU_MEM_ALLOCATION_TYPE_PINNED);
SAME_VALUE(CU_MEM_ALLOC_GRANULARITY_MINIMUM);
SAME_VALUE(CU_POINTER_ATTRIBUTE_CONTEXT);
SAME_VALUE(CU_POINTER_ATTRIBUTE_MEMORY_TYPE);
SAME_VALUE(CU_POINTER_ATTRIBUTE_BUFFER_ID);
SAME_VALUE(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL);
SAME_VALUE(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR);
SAME_VALUE(CU_POINTER_ATTRIBUTE_RANGE_SIZE);
SAME_VALUE(CU_POINTER_ATTRIBUTE_MAPPED);
SAME_VALUE(CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES);
SAME_VALUE(CU_MEMORYTYPE_DEVICE);
SAME_VALUE(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
SAME_VALUE(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
SAME_VALUE(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
SAME_VALUE(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED);
SAME_VALUE(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED);
SAME_VALUE(CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS);
SAME_VALUE(CU_STREAM_WAIT_VALUE_GEQ);
SAME_VALUE(CU_STREAM_WRITE_VALUE_DEFAULT);

#undef SAME_VALUE

// Scalars and handles.
static_assert(sizeof(k::CUresult) == sizeof(::CUresult));
static_assert(sizeof(k::CUdevice) == sizeof(::CUdevice));
static_assert(std::is_same_v<k::CUdeviceptr, ::CUdeviceptr>);
static_assert(std::is_same_v<k::CUmemGenericAllocationHandle,
                             ::CUmemGenericAllocationHandle>);
static_assert(std::is_same_v<k::CUcontext, ::CUcontext>);
static_assert(std::is_same_v<k::CUstream, ::CUstream>);
static_assert(std::is_same_v<k::CUevent, ::CUevent>);
static_assert(sizeof(k::CUmemAllocationHandleType) ==
              sizeof(::CUmemAllocationHandleType));
static_assert(sizeof(k::CUpointer_attribute) == sizeof(::CUpointer_attribute));
static_assert(sizeof(k::CUdevice_attribute) == sizeof(::CUdevice_attribute));

// Structs: size, alignment and every field's offset.
#define SAME_LAYOUT(type)                                  \
  static_assert(sizeof(k::type) == sizeof(::type), #type); \
  static_assert(alignof(k::type) == alignof(::type), #type)
#define SAME_OFFSET(type, field)                                     \
  static_assert(offsetof(k::type, field) == offsetof(::type, field), \
                #type "." #field)

SAME_LAYOUT(CUuuid);
SAME_LAYOUT(CUipcMemHandle);
SAME_LAYOUT(CUipcEventHandle);
SAME_LAYOUT(CUmemLocation);
SAME_OFFSET(CUmemLocation, type);
SAME_OFFSET(CUmemLocation, id);
SAME_LAYOUT(CUmemAllocationProp);
SAME_OFFSET(CUmemAllocationProp, type);
SAME_OFFSET(CUmemAllocationProp, requestedHandleTypes);
SAME_OFFSET(CUmemAllocationProp, location);
SAME_OFFSET(CUmemAllocationProp, win32HandleMetaData);
SAME_OFFSET(CUmemAllocationProp, allocFlags);
SAME_LAYOUT(CUmemAccessDesc);
SAME_OFFSET(CUmemAccessDesc, location);
SAME_OFFSET(CUmemAccessDesc, flags);

#undef SAME_LAYOUT
#undef SAME_OFFSET

TEST_CASE("cu_types.h matches the CUDA toolkit's cuda.h", "[cu_types]") {
  // Everything is checked at compile time; this records that it ran.
  CHECK(CUDA_VERSION >= 12000);
}

}  // namespace
