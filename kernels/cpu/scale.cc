#include "kernels/cpu/scale.h"

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "kernels/cpu/dtypes.h"

namespace kreg::kernels {
namespace {

namespace ffi = xla::ffi;

uint32_t FloatBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

float BitsFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) return BitsFloat(sign | 0x7f800000u | (mantissa << 13));
  return BitsFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// Round to nearest even, like NumPy's float32 -> float16 cast.
uint16_t FloatToHalf(float f) {
  uint32_t bits = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) {  // Inf or NaN (keep NaN quiet).
    return sign | 0x7c00u |
           (magnitude > 0x7f800000u ? 0x200u | ((magnitude >> 13) & 0x3ffu)
                                    : 0u);
  }
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520: Inf.
  if (magnitude < 0x38800000u) {  // Below 2^-14: subnormal half (or zero).
    const float scaled = BitsFloat(magnitude) * 16777216.0f;  // exact
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  magnitude += 0xfffu + ((magnitude >> 13) & 1u);
  magnitude -= 112u << 23;
  return sign | static_cast<uint16_t>(magnitude >> 13);
}

float Bf16ToFloat(uint16_t b) {
  return BitsFloat(static_cast<uint32_t>(b) << 16);
}

// Round to nearest even, like ml_dtypes' float32 -> bfloat16 cast.
uint16_t FloatToBf16(float f) {
  const uint32_t bits = FloatBits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x40u);
  }
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

template <typename T>
T SaturatingFromDouble(double v) {
  if (std::isnan(v)) return T{0};
  v = std::trunc(v);
  constexpr T kLo = std::numeric_limits<T>::min();
  constexpr T kHi = std::numeric_limits<T>::max();
  if (v <= static_cast<double>(kLo)) return kLo;
  // static_cast<double>(kHi) may round up to 2^63 / 2^64: compare with >=.
  if (v >= static_cast<double>(kHi)) return kHi;
  return static_cast<T>(v);
}

template <typename T>
void ScaleIntegers(const void* in, void* out, size_t n, float factor) {
  const T* src = static_cast<const T*>(in);
  T* dst = static_cast<T*>(out);
  const double f = factor;
  for (size_t i = 0; i < n; ++i) {
    dst[i] = SaturatingFromDouble<T>(static_cast<double>(src[i]) * f);
  }
}

template <typename T, typename F>
void ScaleNative(const void* in, void* out, size_t n, F factor) {
  const T* src = static_cast<const T*>(in);
  T* dst = static_cast<T*>(out);
  for (size_t i = 0; i < n; ++i) dst[i] = src[i] * factor;
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void ScaleHalves(const void* in, void* out, size_t n, float factor) {
  const uint16_t* src = static_cast<const uint16_t*>(in);
  uint16_t* dst = static_cast<uint16_t*>(out);
  for (size_t i = 0; i < n; ++i) dst[i] = FromFloat(ToFloat(src[i]) * factor);
}

std::string Name(ffi::DataType dtype) {
  return DataTypeName(static_cast<XLA_FFI_DataType>(dtype));
}

}  // namespace

bool IsScalableType(ffi::DataType dtype) {
  switch (dtype) {
    case ffi::S8:
    case ffi::S16:
    case ffi::S32:
    case ffi::S64:
    case ffi::U8:
    case ffi::U16:
    case ffi::U32:
    case ffi::U64:
    case ffi::F16:
    case ffi::BF16:
    case ffi::F32:
    case ffi::F64:
    case ffi::C64:
    case ffi::C128:
      return true;
    default:
      return false;
  }
}

ffi::Error CheckScaleOperands(std::string_view who, const ffi::AnyBuffer& x,
                              const ffi::AnyBuffer& y) {
  if (!IsScalableType(x.element_type())) {
    return ffi::Error(
        ffi::ErrorCode::kUnimplemented,
        std::string(who) + ": unsupported dtype " + Name(x.element_type()));
  }
  if (y.element_type() != x.element_type()) {
    return ffi::Error::InvalidArgument(
        std::string(who) + ": output dtype " + Name(y.element_type()) +
        " differs from input dtype " + Name(x.element_type()));
  }
  auto xd = x.dimensions();
  auto yd = y.dimensions();
  if (xd.size() != yd.size() || !std::equal(xd.begin(), xd.end(), yd.begin())) {
    return ffi::Error::InvalidArgument(std::string(who) + ": output shape " +
                                       ShapeString(yd.begin(), yd.size()) +
                                       " differs from input shape " +
                                       ShapeString(xd.begin(), xd.size()));
  }
  return ffi::Error::Success();
}

void ScaleElements(ffi::DataType dtype, const void* in, void* out, size_t n,
                   float factor) {
  switch (dtype) {
    case ffi::S8:
      return ScaleIntegers<int8_t>(in, out, n, factor);
    case ffi::S16:
      return ScaleIntegers<int16_t>(in, out, n, factor);
    case ffi::S32:
      return ScaleIntegers<int32_t>(in, out, n, factor);
    case ffi::S64:
      return ScaleIntegers<int64_t>(in, out, n, factor);
    case ffi::U8:
      return ScaleIntegers<uint8_t>(in, out, n, factor);
    case ffi::U16:
      return ScaleIntegers<uint16_t>(in, out, n, factor);
    case ffi::U32:
      return ScaleIntegers<uint32_t>(in, out, n, factor);
    case ffi::U64:
      return ScaleIntegers<uint64_t>(in, out, n, factor);
    case ffi::F16:
      return ScaleHalves<HalfToFloat, FloatToHalf>(in, out, n, factor);
    case ffi::BF16:
      return ScaleHalves<Bf16ToFloat, FloatToBf16>(in, out, n, factor);
    case ffi::F32:
      return ScaleNative<float>(in, out, n, factor);
    case ffi::F64:
      return ScaleNative<double>(in, out, n, static_cast<double>(factor));
    case ffi::C64:
      return ScaleNative<std::complex<float>>(in, out, n, factor);
    case ffi::C128:
      return ScaleNative<std::complex<double>>(in, out, n,
                                               static_cast<double>(factor));
    default:
      return;  // Callers check IsScalableType first.
  }
}

ffi::Error ScaleBuffer(std::string_view who, const ffi::AnyBuffer& x,
                       ffi::AnyBuffer y, float factor) {
  if (ffi::Error err = CheckScaleOperands(who, x, y); err.failure()) {
    return err;
  }
  ScaleElements(x.element_type(), x.untyped_data(), y.untyped_data(),
                x.element_count(), factor);
  return ffi::Error::Success();
}

}  // namespace kreg::kernels
