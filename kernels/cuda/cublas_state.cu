// libcublas_state.so: CUDA handler bundles with a per-call-site state
// (docs/kernel-author-guide.md, "Handler bundles and state"), for the GPU
// tests and bench/bench_state.py.
//   CublasInstantiate  INSTANTIATE: a CublasState holding a cuBLAS handle
//                      (created once per call site, destroyed with it).
//   CublasGemm         EXECUTE: args a, b F32[n,n] (row-major), ret c F32[n,n]
//                      = a @ b with the state's handle on XLA's stream.
//   StagedInstantiate  INSTANTIATE: a StagedState of three counters.
//   StagedPrepare      PREPARE: counts its calls in the state.
//   StagedInitialize   INITIALIZE: counts its calls in the state.
//   StagedExecute      EXECUTE: arg x F32, ret y F32 (x's shape):
//                      y = x + prepares + 1000 * initializes (as counted
//                      so far), so the result says which stages XLA ran.
//   CublasStateTypeId / CublasStateTypeInfo, StagedStateTypeId /
//   StagedStateTypeInfo: the state types' XLA_FFI_TypeId and TypeInfo.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/cublas_state.h"

namespace ffi = xla::ffi;

namespace kreg::kernels::cuda {
namespace {

// Aliases: a comma inside a macro argument would split it.
using Matrix = ffi::Buffer<ffi::F32, 2>;
using MatrixResult = ffi::ResultBuffer<ffi::F32, 2>;

__global__ void AddCounts(const float* x, float* y, int64_t n, float add) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = x[i] + add;
}

ffi::Error CublasGemmImpl(cudaStream_t stream, CublasState* state, Matrix a,
                          Matrix b, MatrixResult c) {
  const auto n = a.dimensions()[0];
  if (a.dimensions()[1] != n || b.dimensions()[0] != n ||
      b.dimensions()[1] != n || c->dimensions()[0] != n ||
      c->dimensions()[1] != n) {
    return ffi::Error::InvalidArgument(
        "cublas_state.CublasGemm: a, b and c must be square of one size");
  }
  if (cublasSetStream(state->handle, stream) != CUBLAS_STATUS_SUCCESS) {
    return ffi::Error::Internal("cublas_state.CublasGemm: cublasSetStream");
  }
  const float one = 1.0f, zero = 0.0f;
  const int m = static_cast<int>(n);
  // Row-major c = a @ b is column-major c^T = b^T @ a^T.
  cublasStatus_t s = cublasSgemm(state->handle, CUBLAS_OP_N, CUBLAS_OP_N, m, m,
                                 m, &one, b.typed_data(), m, a.typed_data(), m,
                                 &zero, c->typed_data(), m);
  if (s != CUBLAS_STATUS_SUCCESS) {
    return ffi::Error::Internal("cublas_state.CublasGemm: cublasSgemm status " +
                                std::to_string(static_cast<int>(s)));
  }
  return ffi::Error::Success();
}

ffi::Error StagedExecuteImpl(cudaStream_t stream, StagedState* state,
                             ffi::Buffer<ffi::F32> x,
                             ffi::ResultBuffer<ffi::F32> y) {
  const int64_t n = static_cast<int64_t>(x.element_count());
  const float add = static_cast<float>(state->prepares) +
                    1000.0f * static_cast<float>(state->initializes);
  if (n > 0) {
    AddCounts<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
        x.typed_data(), y->typed_data(), n, add);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
      return ffi::Error::Internal(std::string("StagedExecute: ") +
                                  cudaGetErrorString(err));
    }
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace kreg::kernels::cuda

namespace kk = kreg::kernels::cuda;

KREG_EXPORT_HANDLER(CublasGemm);
KREG_EXPORT_HANDLER(StagedExecute);

XLA_FFI_DEFINE_HANDLER_SYMBOL(CublasGemm, kk::CublasGemmImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::State<kk::CublasState>>()
                                  .Arg<kk::Matrix>()
                                  .Arg<kk::Matrix>()
                                  .Ret<kk::Matrix>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(StagedExecute, kk::StagedExecuteImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::State<kk::StagedState>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
