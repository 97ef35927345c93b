// libdemo_cuda.so (and libdemo_cuda_v2.so, whose Scale scales by factor + 1,
// like libdemo_v2.so's): Scale, the CUDA twin of kernels/cpu's Scale. Every dtype
// the CPU kernel accepts, with bit-identical results: floats in f32 (f16/bf16
// via f32, round to nearest even), f64/c128 with double(factor), integers
// trunc(double(x) * factor) saturated (NaN -> 0). `factor` is an f32 or f64
// attribute, computed as f32. Operand checks are the CPU
// kernel's (kernels/cpu/scale.cc), so the error messages are the same.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <limits>

#include "kernels/cpu/export.h"
#include "kernels/cpu/scale.h"
#include "kernels/cuda/cuda_util.h"
#include "xla/ffi/api/ffi.h"

#ifndef KREG_DEMO_V2
#define KREG_DEMO_V2 0
#endif

namespace ffi = xla::ffi;

namespace kreg::kernels::cuda {
namespace {

// The bit conversions of kernels/cpu/scale.cc, on the device.
__device__ float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = ldexpf(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) {
    return __uint_as_float(sign | 0x7f800000u | (mantissa << 13));
  }
  return __uint_as_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

__device__ uint16_t FloatToHalf(float f) {
  uint32_t bits = __float_as_uint(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) {
    return sign | 0x7c00u |
           (magnitude > 0x7f800000u ? 0x200u | ((magnitude >> 13) & 0x3ffu)
                                    : 0u);
  }
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;
  if (magnitude < 0x38800000u) {
    const float scaled = __uint_as_float(magnitude) * 16777216.0f;  // exact
    return sign | static_cast<uint16_t>(nearbyintf(scaled));
  }
  magnitude += 0xfffu + ((magnitude >> 13) & 1u);
  magnitude -= 112u << 23;
  return sign | static_cast<uint16_t>(magnitude >> 13);
}

__device__ float Bf16ToFloat(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

__device__ uint16_t FloatToBf16(float f) {
  const uint32_t bits = __float_as_uint(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x40u);
  }
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

template <typename T>
struct IntegerOp {
  double factor;
  T lo;
  T hi;
  double lo_d;
  double hi_d;
  __device__ T operator()(T x) const {
    double v = static_cast<double>(x) * factor;
    if (isnan(v)) return T{0};
    v = trunc(v);
    if (v <= lo_d) return lo;
    if (v >= hi_d) return hi;  // hi_d may round up to 2^63 / 2^64.
    return static_cast<T>(v);
  }
};

struct F32Op {
  float factor;
  __device__ float operator()(float x) const { return x * factor; }
};

struct F64Op {
  double factor;
  __device__ double operator()(double x) const { return x * factor; }
};

struct F16Op {
  float factor;
  __device__ uint16_t operator()(uint16_t x) const {
    return FloatToHalf(HalfToFloat(x) * factor);
  }
};

struct Bf16Op {
  float factor;
  __device__ uint16_t operator()(uint16_t x) const {
    return FloatToBf16(Bf16ToFloat(x) * factor);
  }
};

struct C64Op {
  float factor;
  __device__ float2 operator()(float2 x) const {
    return make_float2(x.x * factor, x.y * factor);
  }
};

struct C128Op {
  double factor;
  __device__ double2 operator()(double2 x) const {
    return make_double2(x.x * factor, x.y * factor);
  }
};

template <typename T, typename Op>
__global__ void MapKernel(const T* in, T* out, size_t n, Op op) {
  KREG_GRID_STRIDE_LOOP(i, n) { out[i] = op(in[i]); }
}

template <typename T, typename Op>
void Map(cudaStream_t stream, const void* in, void* out, size_t n, Op op) {
  MapKernel<T, Op><<<BlocksFor(n), kThreads, 0, stream>>>(
      static_cast<const T*>(in), static_cast<T*>(out), n, op);
}

template <typename T>
void MapIntegers(cudaStream_t stream, const void* in, void* out, size_t n,
                 float factor) {
  constexpr T kLo = std::numeric_limits<T>::min();
  constexpr T kHi = std::numeric_limits<T>::max();
  Map<T>(stream, in, out, n,
         IntegerOp<T>{static_cast<double>(factor), kLo, kHi,
                      static_cast<double>(kLo), static_cast<double>(kHi)});
}

// Queues y = x * factor; dtype already checked by CheckScaleOperands.
void ScaleOnStream(cudaStream_t s, ffi::DataType dtype, const void* in,
                   void* out, size_t n, float factor) {
  switch (dtype) {
    case ffi::S8:
      return MapIntegers<int8_t>(s, in, out, n, factor);
    case ffi::S16:
      return MapIntegers<int16_t>(s, in, out, n, factor);
    case ffi::S32:
      return MapIntegers<int32_t>(s, in, out, n, factor);
    case ffi::S64:
      return MapIntegers<int64_t>(s, in, out, n, factor);
    case ffi::U8:
      return MapIntegers<uint8_t>(s, in, out, n, factor);
    case ffi::U16:
      return MapIntegers<uint16_t>(s, in, out, n, factor);
    case ffi::U32:
      return MapIntegers<uint32_t>(s, in, out, n, factor);
    case ffi::U64:
      return MapIntegers<uint64_t>(s, in, out, n, factor);
    case ffi::F16:
      return Map<uint16_t>(s, in, out, n, F16Op{factor});
    case ffi::BF16:
      return Map<uint16_t>(s, in, out, n, Bf16Op{factor});
    case ffi::F32:
      return Map<float>(s, in, out, n, F32Op{factor});
    case ffi::F64:
      return Map<double>(s, in, out, n, F64Op{static_cast<double>(factor)});
    case ffi::C64:
      return Map<float2>(s, in, out, n, C64Op{factor});
    case ffi::C128:
      return Map<double2>(s, in, out, n, C128Op{static_cast<double>(factor)});
    default:
      return;
  }
}

ffi::Error ScaleImpl(cudaStream_t stream, ffi::AnyBuffer x,
                     ffi::Result<ffi::AnyBuffer> y, Factor attr) {
  constexpr char kWho[] = "demo.Scale";
  // libdemo_cuda_v2.so scales by factor + 1, as libdemo_v2.so does: the
  // replace tests tell the generations apart by it.
  const float factor = AsFloat(attr) + (KREG_DEMO_V2 ? 1.0f : 0.0f);
  if (ffi::Error err = CheckScaleOperands(kWho, x, *y); err.failure()) {
    return err;
  }
  const size_t n = x.element_count();
  if (n == 0) return ffi::Error::Success();
  ScaleOnStream(stream, x.element_type(), x.untyped_data(), y->untyped_data(),
                n, factor);
  return LastCudaError(kWho, "kernel launch");
}

}  // namespace
}  // namespace kreg::kernels::cuda

KREG_EXPORT_HANDLER(Scale);

XLA_FFI_DEFINE_HANDLER_SYMBOL(Scale, kreg::kernels::cuda::ScaleImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<kreg::kernels::Factor>("factor"));
