// libhostile_cuda.so: a CUDA handler that faults on purpose, for the GPU
// executor test (DESIGN §8: a kernel that faults on the GPU fails its
// caller's call and leaves other clients' results correct). Not a kernel
// to copy.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/cpu/export.h"
#include "xla/ffi/api/ffi.h"

namespace kreg::kernels::cuda {
namespace {

namespace ffi = xla::ffi;

__global__ void WriteToBadAddress(float* out) {
  // An address no allocation has: cudaErrorIllegalAddress, which is sticky
  // (the context that ran it is unusable from then on).
  float* bad = reinterpret_cast<float*>(static_cast<uintptr_t>(0x10));
  *bad = *out;
}

ffi::Error IllegalAddressImpl(cudaStream_t stream, ffi::AnyBuffer,
                              ffi::Result<ffi::Buffer<ffi::F32>> y) {
  WriteToBadAddress<<<1, 1, 0, stream>>>(y->typed_data());
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return ffi::Error::Internal(std::string("launch failed: ") +
                                cudaGetErrorString(err));
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace kreg::kernels::cuda

namespace ffi = xla::ffi;

KREG_EXPORT_HANDLER(IllegalAddress);

XLA_FFI_DEFINE_HANDLER_SYMBOL(IllegalAddress,
                              kreg::kernels::cuda::IllegalAddressImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
