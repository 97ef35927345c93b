// Launch helpers shared by the CUDA reference kernels.
#ifndef KREGD_KERNELS_CUDA_CUDA_UTIL_H_
#define KREGD_KERNELS_CUDA_CUDA_UTIL_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>

#include "xla/ffi/api/ffi.h"

namespace kreg::kernels::cuda {

inline constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements (n > 0).
inline int BlocksFor(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(std::min<size_t>(blocks, 4096));
}

// OK, or INTERNAL "<who>: <what> failed: <cudaGetErrorName>: <string>" for
// the last CUDA runtime error (cudaGetLastError clears it).
inline xla::ffi::Error LastCudaError(std::string_view who,
                                     std::string_view what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return xla::ffi::Error::Success();
  return xla::ffi::Error::Internal(std::string(who) + ": " + std::string(what) +
                                   " failed: " + cudaGetErrorName(err) + ": " +
                                   cudaGetErrorString(err));
}

// As LastCudaError, for a runtime call's result.
inline xla::ffi::Error CudaCall(std::string_view who, std::string_view what,
                                cudaError_t err) {
  if (err == cudaSuccess) return xla::ffi::Error::Success();
  cudaGetLastError();  // Clear it: the error is reported here.
  return xla::ffi::Error::Internal(std::string(who) + ": " + std::string(what) +
                                   " failed: " + cudaGetErrorName(err) + ": " +
                                   cudaGetErrorString(err));
}

// Grid-stride loop index helpers.
#define KREG_GRID_STRIDE_LOOP(i, n)                                           \
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; \
       i < (n); i += static_cast<size_t>(blockDim.x) * gridDim.x)

}  // namespace kreg::kernels::cuda

#endif  // KREGD_KERNELS_CUDA_CUDA_UTIL_H_
