// The state types of libcublas_state.so (see cublas_state.cu), shared by
// its host-only part (cublas_state_host.cc: instantiate, prepare and
// initialize stages, type infos) and its CUDA part.
#ifndef KREGD_KERNELS_CUDA_CUBLAS_STATE_H_
#define KREGD_KERNELS_CUDA_CUBLAS_STATE_H_

#include <cublas_v2.h>

#include <cstdint>

#include "kernels/cpu/export.h"
#include "xla/ffi/api/ffi.h"

namespace kreg::kernels::cuda {

struct CublasState {
  static xla::ffi::TypeId id asm("CublasStateTypeId");
  cublasHandle_t handle = nullptr;
  ~CublasState() {
    if (handle != nullptr) cublasDestroy(handle);
  }
};

struct StagedState {
  static xla::ffi::TypeId id asm("StagedStateTypeId");
  int64_t prepares = 0;
  int64_t initializes = 0;
};

}  // namespace kreg::kernels::cuda

#endif  // KREGD_KERNELS_CUDA_CUBLAS_STATE_H_
