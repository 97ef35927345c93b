// libcounter_state.so: a handler bundle with a per-call-site state (XLA
// FFI's State API; docs/kernel-author-guide.md, "Handler bundles and state").
//   CounterInstantiate  INSTANTIATE stage: attrs `offset` (f32) and
//                       `buffer_elems` (s64, 1..1<<24) -> a new CounterState
//                       holding a call counter (0) and a buffer of
//                       buffer_elems floats, buffer[i] = offset * (i % 7).
//   CounterExecute      EXECUTE stage: arg x F32, rets y F32 (x's shape) and
//                       n S64 (scalar): counter += 1, then
//                       y[i] = x[i] + buffer[i % buffer_elems] + counter and
//                       n = counter. So each call site's results depend on
//                       its own state's history.
//   CounterNotAHandler  a C function that is not an XLA FFI handler (a
//                       registration test's bad stage symbol).
//   CounterCrashingInstantiate  INSTANTIATE stage, same attrs: aborts the
//                       process (a crash test's instantiate stage).
//   CounterPrepare      PREPARE stage (XLA:GPU runs it, XLA:CPU does not):
//                       counts nothing, takes any buffers (bundle tests).
//   CounterStagedPrepare     PREPARE stage: prepares += 1 and
//                            seen_elems = the element count of every arg
//                            and ret (their shapes; never their data).
//   CounterStagedInitialize  INITIALIZE stage: initializes += 1.
//   CounterStagedExecute     EXECUTE stage: arg x F32, rets y F32 (x's
//                            shape) and n S64 (scalar): y[i] = x[i] +
//                            buffer[i % buffer_elems] + prepares + 1000 *
//                            initializes, n = seen_elems. So the result says
//                            which stages ran, how often, and on what shapes.
//   CounterPreparedState     PREPARE stage that returns a per-execution
//                            state (ffi::Prepared<CounterState>).
//   CounterCrashingPrepare   PREPARE stage: aborts the process.
//   CounterStateTypeId   data: the state's XLA_FFI_TypeId
//   CounterStateTypeInfo data: its XLA_FFI_TypeInfo (the deleter)
// Register the type first: jax.ffi.register_ffi_type("kreg.CounterState",
// {"type_id": <CounterStateTypeId>, "type_info": <CounterStateTypeInfo>}),
// or, with kregd, --state-type
// kreg.CounterState/CounterStateTypeId/CounterStateTypeInfo.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "kernels/cpu/export.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace kreg::kernels {

struct CounterState {
  // Exported under a C name, so a registration can name it.
  static ffi::TypeId id asm("CounterStateTypeId");
  CounterState(float offset, int64_t elems) : buffer(elems) {
    for (int64_t i = 0; i < elems; ++i) buffer[i] = offset * (i % 7);
  }
  int64_t counter = 0;
  std::vector<float> buffer;
  int64_t prepares = 0;  // the staged bundle's stages
  int64_t initializes = 0;
  int64_t seen_elems = 0;
};

KREG_EXPORT ffi::TypeId CounterState::id = XLA_FFI_UNKNOWN_TYPE_ID;

namespace {

ffi::ErrorOr<std::unique_ptr<CounterState>> InstantiateImpl(
    float offset, int64_t buffer_elems) {
  if (buffer_elems < 1 || buffer_elems > (int64_t{1} << 24)) {
    return ffi::Error::InvalidArgument(
        "counter_state.CounterInstantiate: buffer_elems must be in "
        "[1, 16777216]");
  }
  return std::make_unique<CounterState>(offset, buffer_elems);
}

ffi::ErrorOr<std::unique_ptr<CounterState>> CrashingInstantiateImpl(
    float /*offset*/, int64_t /*buffer_elems*/) {
  std::abort();
}

ffi::Error PrepareImpl(CounterState* /*state*/, ffi::RemainingArgs,
                       ffi::RemainingRets) {
  return ffi::Error::Success();
}

ffi::Error StagedPrepareImpl(CounterState* state, ffi::RemainingArgs args,
                             ffi::RemainingRets rets) {
  state->prepares += 1;
  int64_t elems = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    ffi::ErrorOr<ffi::AnyBuffer> b = args.get<ffi::AnyBuffer>(i);
    if (!b.has_value()) return b.error();
    elems += static_cast<int64_t>(b->element_count());
  }
  for (size_t i = 0; i < rets.size(); ++i) {
    ffi::ErrorOr<ffi::Result<ffi::AnyBuffer>> b = rets.get<ffi::AnyBuffer>(i);
    if (!b.has_value()) return b.error();
    elems += static_cast<int64_t>((*b)->element_count());
  }
  state->seen_elems = elems;
  return ffi::Error::Success();
}

ffi::Error StagedInitializeImpl(CounterState* state, ffi::RemainingArgs,
                                ffi::RemainingRets) {
  state->initializes += 1;
  return ffi::Error::Success();
}

ffi::Error StagedExecuteImpl(CounterState* state, ffi::Buffer<ffi::F32> x,
                             ffi::ResultBuffer<ffi::F32> y,
                             ffi::ResultBuffer<ffi::S64> n) {
  if (x.element_count() != y->element_count() || n->element_count() != 1) {
    return ffi::Error::InvalidArgument(
        "counter_state.CounterStagedExecute: y must have x's size and n one "
        "element");
  }
  const size_t m = state->buffer.size();
  const float add = static_cast<float>(state->prepares) +
                    1000.0f * static_cast<float>(state->initializes);
  for (size_t i = 0; i < x.element_count(); ++i) {
    y->typed_data()[i] = x.typed_data()[i] + state->buffer[i % m] + add;
  }
  n->typed_data()[0] = state->seen_elems;
  return ffi::Error::Success();
}

ffi::ErrorOr<std::unique_ptr<CounterState>> PreparedStateImpl(
    CounterState* /*state*/) {
  return std::make_unique<CounterState>(0.0f, 1);
}

ffi::Error CrashingPrepareImpl(CounterState* /*state*/) { std::abort(); }

ffi::Error ExecuteImpl(CounterState* state, ffi::Buffer<ffi::F32> x,
                       ffi::ResultBuffer<ffi::F32> y,
                       ffi::ResultBuffer<ffi::S64> n) {
  if (x.element_count() != y->element_count() || n->element_count() != 1) {
    return ffi::Error::InvalidArgument(
        "counter_state.CounterExecute: y must have x's size and n one "
        "element");
  }
  state->counter += 1;
  const size_t m = state->buffer.size();
  const float* in = x.typed_data();
  float* out = y->typed_data();
  for (size_t i = 0; i < x.element_count(); ++i) {
    out[i] = in[i] + state->buffer[i % m] + static_cast<float>(state->counter);
  }
  n->typed_data()[0] = state->counter;
  return ffi::Error::Success();
}

}  // namespace
}  // namespace kreg::kernels

extern "C" KREG_EXPORT const XLA_FFI_TypeInfo CounterStateTypeInfo =
    ffi::MakeTypeInfo<kreg::kernels::CounterState>();

extern "C" KREG_EXPORT XLA_FFI_Error* CounterNotAHandler(
    XLA_FFI_CallFrame* /*call_frame*/) {
  return nullptr;  // answers nothing, fills no metadata
}

KREG_EXPORT_HANDLER(CounterInstantiate);
KREG_EXPORT_HANDLER(CounterCrashingInstantiate);
KREG_EXPORT_HANDLER(CounterPrepare);
KREG_EXPORT_HANDLER(CounterExecute);
KREG_EXPORT_HANDLER(CounterStagedPrepare);
KREG_EXPORT_HANDLER(CounterStagedInitialize);
KREG_EXPORT_HANDLER(CounterStagedExecute);
KREG_EXPORT_HANDLER(CounterPreparedState);
KREG_EXPORT_HANDLER(CounterCrashingPrepare);

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    CounterStagedPrepare, kreg::kernels::StagedPrepareImpl,
    ffi::Ffi::BindPrepare()
        .Ctx<ffi::State<kreg::kernels::CounterState>>()
        .RemainingArgs()
        .RemainingRets());

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    CounterStagedInitialize, kreg::kernels::StagedInitializeImpl,
    ffi::Ffi::BindInitialize()
        .Ctx<ffi::State<kreg::kernels::CounterState>>()
        .RemainingArgs()
        .RemainingRets());

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    CounterStagedExecute, kreg::kernels::StagedExecuteImpl,
    ffi::Ffi::Bind()
        .Ctx<ffi::State<kreg::kernels::CounterState>>()
        .Arg<ffi::Buffer<ffi::F32>>()
        .Ret<ffi::Buffer<ffi::F32>>()
        .Ret<ffi::Buffer<ffi::S64>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    CounterPreparedState, kreg::kernels::PreparedStateImpl,
    ffi::Ffi::BindPrepare().Ctx<ffi::State<kreg::kernels::CounterState>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    CounterCrashingPrepare, kreg::kernels::CrashingPrepareImpl,
    ffi::Ffi::BindPrepare().Ctx<ffi::State<kreg::kernels::CounterState>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(CounterInstantiate,
                              kreg::kernels::InstantiateImpl,
                              ffi::Ffi::BindInstantiate()
                                  .Attr<float>("offset")
                                  .Attr<int64_t>("buffer_elems"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(CounterCrashingInstantiate,
                              kreg::kernels::CrashingInstantiateImpl,
                              ffi::Ffi::BindInstantiate()
                                  .Attr<float>("offset")
                                  .Attr<int64_t>("buffer_elems"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    CounterPrepare, kreg::kernels::PrepareImpl,
    ffi::Ffi::BindPrepare()
        .Ctx<ffi::State<kreg::kernels::CounterState>>()
        .RemainingArgs()
        .RemainingRets());

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    CounterExecute, kreg::kernels::ExecuteImpl,
    ffi::Ffi::Bind()
        .Ctx<ffi::State<kreg::kernels::CounterState>>()
        .Arg<ffi::Buffer<ffi::F32>>()
        .Ret<ffi::Buffer<ffi::F32>>()
        .Ret<ffi::Buffer<ffi::S64>>());
