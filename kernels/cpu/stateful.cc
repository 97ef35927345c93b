// libstateful.so: a stateful handler pair using XLA FFI's State API.
//   Stateful          INSTANTIATE stage: attr `offset` (f32) -> a new
//                     StatefulState; its metadata reports the state's type id.
//   StatefulExecute   EXECUTE stage: arg x F32, ret y F32 (same shape),
//                     y = x + state.offset; counts its calls in the state.
//   StatefulTypeId    XLA_FFI_TypeId* of StatefulState (register it with XLA
//                     before the handler: jax.ffi.register_ffi_type, or the
//                     host's XLA_FFI_Type_Register).
//   StatefulTypeInfo  const XLA_FFI_TypeInfo* (deleter of StatefulState).
// Until the type is registered its id is 0 and the metadata call of
// `Stateful` fails with FAILED_PRECONDITION (ffi.h's rule).

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/cpu/export.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace kreg::kernels {

struct StatefulState {
  static ffi::TypeId id;
  explicit StatefulState(float offset) : offset(offset) {}
  float offset;
  std::atomic<int64_t> calls{0};
};

ffi::TypeId StatefulState::id = XLA_FFI_UNKNOWN_TYPE_ID;

namespace {

constexpr XLA_FFI_TypeInfo kStatefulTypeInfo =
    ffi::MakeTypeInfo<StatefulState>();

ffi::ErrorOr<std::unique_ptr<StatefulState>> InstantiateImpl(float offset) {
  return std::make_unique<StatefulState>(offset);
}

ffi::Error ExecuteImpl(StatefulState* state, ffi::Buffer<ffi::F32> x,
                       ffi::Result<ffi::Buffer<ffi::F32>> y) {
  if (x.element_count() != y->element_count()) {
    return ffi::Error::InvalidArgument(
        "stateful.StatefulExecute: output size differs from input size");
  }
  state->calls.fetch_add(1, std::memory_order_relaxed);
  const float* in = x.typed_data();
  float* out = y->typed_data();
  for (size_t i = 0; i < x.element_count(); ++i) out[i] = in[i] + state->offset;
  return ffi::Error::Success();
}

}  // namespace
}  // namespace kreg::kernels

extern "C" KREG_EXPORT XLA_FFI_TypeId* StatefulTypeId() {
  return &kreg::kernels::StatefulState::id;
}

extern "C" KREG_EXPORT const XLA_FFI_TypeInfo* StatefulTypeInfo() {
  return &kreg::kernels::kStatefulTypeInfo;
}

KREG_EXPORT_HANDLER(Stateful);
KREG_EXPORT_HANDLER(StatefulExecute);

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    Stateful, kreg::kernels::InstantiateImpl,
    ffi::Ffi::BindInstantiate().Attr<float>("offset"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    StatefulExecute, kreg::kernels::ExecuteImpl,
    ffi::Ffi::Bind()
        .Ctx<ffi::State<kreg::kernels::StatefulState>>()
        .Arg<ffi::Buffer<ffi::F32>>()
        .Ret<ffi::Buffer<ffi::F32>>());
