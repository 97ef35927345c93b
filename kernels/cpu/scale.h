// Element-wise y = x * factor over every dtype the demo kernels accept.
// Shared by the Scale/Ok/AsyncScale handlers of several kernel modules.

#ifndef KREGD_KERNELS_CPU_SCALE_H_
#define KREGD_KERNELS_CPU_SCALE_H_

#include <cstddef>
#include <string_view>
#include <variant>

#include "xla/ffi/api/ffi.h"

namespace kreg::kernels {

// Whether ScaleElements implements `dtype`: PRED-free integers (S8..S64,
// U8..U64), F16, BF16, F32, F64, C64, C128.
bool IsScalableType(xla::ffi::DataType dtype);

// Checks that `y` has the dtype and dimensions of `x` and that the dtype is
// scalable. Errors are INVALID_ARGUMENT (mismatch) or UNIMPLEMENTED (dtype);
// messages start with `who`.
xla::ffi::Error CheckScaleOperands(std::string_view who,
                                   const xla::ffi::AnyBuffer& x,
                                   const xla::ffi::AnyBuffer& y);

// Writes out[i] = in[i] * factor for n elements of `dtype` (which must be
// scalable). Floats compute in float (F16/BF16 round to nearest even), F64 and
// integers in double; integers truncate toward zero and saturate. `in` and
// `out` may be the same pointer.
void ScaleElements(xla::ffi::DataType dtype, const void* in, void* out,
                   size_t n, float factor);

// The `factor` attribute: JAX passes a Python float as f64 and np.float32 as
// f32; both are accepted and computed as float.
using Factor = std::variant<float, double>;
inline float AsFloat(Factor f) {
  return std::visit([](auto v) { return static_cast<float>(v); }, f);
}

// CheckScaleOperands, then ScaleElements.
xla::ffi::Error ScaleBuffer(std::string_view who, const xla::ffi::AnyBuffer& x,
                            xla::ffi::AnyBuffer y, float factor);

}  // namespace kreg::kernels

#endif  // KREGD_KERNELS_CPU_SCALE_H_
