// libdemo.so: Accumulate and AccumulateInPlace, partial in-place updates for
// input_output_aliases (out[idx[i]] += 1, every other element left alone).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "kernels/cpu/export.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace kreg::kernels {
namespace {

// Checks sizes and that every index is inside the state.
ffi::Error CheckAccumulate(const char* who, const ffi::Buffer<ffi::F32>& state,
                           const ffi::Buffer<ffi::S32>& idx,
                           const ffi::Buffer<ffi::F32>& out) {
  const size_t n = state.element_count();
  if (out.element_count() != n) {
    return ffi::Error::InvalidArgument(std::string(who) + ": output has " +
                                       std::to_string(out.element_count()) +
                                       " elements, state " + std::to_string(n));
  }
  const int32_t* indices = idx.typed_data();
  for (size_t i = 0; i < idx.element_count(); ++i) {
    if (indices[i] < 0 || static_cast<size_t>(indices[i]) >= n) {
      return ffi::Error::InvalidArgument(
          std::string(who) + ": idx[" + std::to_string(i) +
          "] = " + std::to_string(indices[i]) + " is outside [0, " +
          std::to_string(n) + ")");
    }
  }
  return ffi::Error::Success();
}

void AddOnes(const ffi::Buffer<ffi::S32>& idx, float* out) {
  const int32_t* indices = idx.typed_data();
  for (size_t i = 0; i < idx.element_count(); ++i) out[indices[i]] += 1.0f;
}

// Correct whether or not XLA aliased `out` to `state`: copies first if not.
ffi::Error AccumulateImpl(ffi::Buffer<ffi::F32> state,
                          ffi::Buffer<ffi::S32> idx,
                          ffi::Result<ffi::Buffer<ffi::F32>> out) {
  if (ffi::Error err = CheckAccumulate("demo.Accumulate", state, idx, *out);
      err.failure()) {
    return err;
  }
  if (out->untyped_data() != state.untyped_data()) {
    std::memcpy(out->untyped_data(), state.untyped_data(), state.size_bytes());
  }
  AddOnes(idx, out->typed_data());
  return ffi::Error::Success();
}

// Requires the aliased pair to be one buffer and touches only out[idx[i]].
ffi::Error AccumulateInPlaceImpl(ffi::Buffer<ffi::F32> state,
                                 ffi::Buffer<ffi::S32> idx,
                                 ffi::Result<ffi::Buffer<ffi::F32>> out) {
  if (out->untyped_data() != state.untyped_data()) {
    return ffi::Error::InvalidArgument(
        "AccumulateInPlace: input and output are not the same buffer");
  }
  if (ffi::Error err =
          CheckAccumulate("demo.AccumulateInPlace", state, idx, *out);
      err.failure()) {
    return err;
  }
  AddOnes(idx, out->typed_data());
  return ffi::Error::Success();
}

}  // namespace
}  // namespace kreg::kernels

KREG_EXPORT_HANDLER(Accumulate);
KREG_EXPORT_HANDLER(AccumulateInPlace);

XLA_FFI_DEFINE_HANDLER_SYMBOL(Accumulate, kreg::kernels::AccumulateImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(AccumulateInPlace,
                              kreg::kernels::AccumulateInPlaceImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
