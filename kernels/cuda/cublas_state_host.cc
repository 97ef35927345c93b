// libcublas_state.so's host-only handlers (compiled by the host compiler:
// see cublas_state.cu for the library's symbols).
#include <memory>
#include <string>

#include "kernels/cuda/cublas_state.h"

namespace ffi = xla::ffi;

namespace kreg::kernels::cuda {

KREG_EXPORT ffi::TypeId CublasState::id = XLA_FFI_UNKNOWN_TYPE_ID;
KREG_EXPORT ffi::TypeId StagedState::id = XLA_FFI_UNKNOWN_TYPE_ID;

namespace {

ffi::ErrorOr<std::unique_ptr<CublasState>> CublasInstantiateImpl() {
  auto state = std::make_unique<CublasState>();
  cublasStatus_t s = cublasCreate(&state->handle);
  if (s != CUBLAS_STATUS_SUCCESS) {
    state->handle = nullptr;
    return ffi::Error::Internal(
        "cublas_state.CublasInstantiate: cublasCreate failed with status " +
        std::to_string(static_cast<int>(s)));
  }
  return state;
}

ffi::ErrorOr<std::unique_ptr<StagedState>> StagedInstantiateImpl() {
  return std::make_unique<StagedState>();
}

ffi::Error StagedPrepareImpl(StagedState* state, ffi::RemainingArgs,
                             ffi::RemainingRets) {
  state->prepares += 1;
  return ffi::Error::Success();
}

ffi::Error StagedInitializeImpl(StagedState* state, ffi::RemainingArgs,
                                ffi::RemainingRets) {
  state->initializes += 1;
  return ffi::Error::Success();
}

}  // namespace
}  // namespace kreg::kernels::cuda

namespace kk = kreg::kernels::cuda;

extern "C" KREG_EXPORT const XLA_FFI_TypeInfo CublasStateTypeInfo =
    ffi::MakeTypeInfo<kk::CublasState>();
extern "C" KREG_EXPORT const XLA_FFI_TypeInfo StagedStateTypeInfo =
    ffi::MakeTypeInfo<kk::StagedState>();

KREG_EXPORT_HANDLER(CublasInstantiate);
KREG_EXPORT_HANDLER(StagedInstantiate);
KREG_EXPORT_HANDLER(StagedPrepare);
KREG_EXPORT_HANDLER(StagedInitialize);

XLA_FFI_DEFINE_HANDLER_SYMBOL(CublasInstantiate, kk::CublasInstantiateImpl,
                              ffi::Ffi::BindInstantiate());
XLA_FFI_DEFINE_HANDLER_SYMBOL(StagedInstantiate, kk::StagedInstantiateImpl,
                              ffi::Ffi::BindInstantiate());
XLA_FFI_DEFINE_HANDLER_SYMBOL(StagedPrepare, kk::StagedPrepareImpl,
                              ffi::Ffi::BindPrepare()
                                  .Ctx<ffi::State<kk::StagedState>>()
                                  .RemainingArgs()
                                  .RemainingRets());
XLA_FFI_DEFINE_HANDLER_SYMBOL(StagedInitialize, kk::StagedInitializeImpl,
                              ffi::Ffi::BindInitialize()
                                  .Ctx<ffi::State<kk::StagedState>>()
                                  .RemainingArgs()
                                  .RemainingRets());
