// libdemo.so (and libdemo_v2.so): Scale, AddMul, Fail, ScratchSum, AsyncScale.
//
// Built twice from the same sources: libdemo_v2.so adds -DKREG_DEMO_V2=1,
// which changes the module's bytes (kDemoVersion) and Scale's results (it
// scales by factor + 1): tests use it for refuse-on-change and to see which
// generation of a replaced target ran (docs/replace.md).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "kernels/cpu/dtypes.h"
#include "kernels/cpu/export.h"
#include "kernels/cpu/scale.h"
#include "xla/ffi/api/ffi.h"

#ifndef KREG_DEMO_V2
#define KREG_DEMO_V2 0
#endif

namespace ffi = xla::ffi;

namespace kreg::kernels {

using Vector = ffi::Buffer<ffi::F32, 1>;

namespace {

// Kept in the image so the v1 and v2 modules differ in content.
#if KREG_DEMO_V2
[[maybe_unused]] __attribute__((used)) const char kDemoVersion[] =
    "kreg demo kernels v2";
#else
[[maybe_unused]] __attribute__((used)) const char kDemoVersion[] =
    "kreg demo kernels v1";
#endif

ffi::Error ScaleImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                     Factor attr) {
  float factor = AsFloat(attr);
#if KREG_DEMO_V2
  factor += 1.0f;
#endif
  return ScaleBuffer("demo.Scale", x, *y, factor);
}

ffi::Error AddMulImpl(ffi::Buffer<ffi::F32> a, ffi::Buffer<ffi::F32> b,
                      ffi::Result<ffi::Buffer<ffi::F32>> sum,
                      ffi::Result<ffi::Buffer<ffi::F32>> prod) {
  auto same = [](ffi::Span<const int64_t> p, ffi::Span<const int64_t> q) {
    return p.size() == q.size() && std::equal(p.begin(), p.end(), q.begin());
  };
  auto shape = [](ffi::Span<const int64_t> d) {
    return ShapeString(d.begin(), d.size());
  };
  if (!same(a.dimensions(), b.dimensions()) ||
      !same(a.dimensions(), sum->dimensions()) ||
      !same(a.dimensions(), prod->dimensions())) {
    return ffi::Error::InvalidArgument(
        "demo.AddMul: shapes differ: a " + shape(a.dimensions()) + ", b " +
        shape(b.dimensions()) + ", sum " + shape(sum->dimensions()) +
        ", prod " + shape(prod->dimensions()));
  }
  const float* pa = a.typed_data();
  const float* pb = b.typed_data();
  float* ps = sum->typed_data();
  float* pp = prod->typed_data();
  const size_t n = a.element_count();
  for (size_t i = 0; i < n; ++i) {
    const float va = pa[i];
    const float vb = pb[i];
    ps[i] = va + vb;
    pp[i] = va * vb;
  }
  return ffi::Error::Success();
}

ffi::Error FailImpl(ffi::AnyBuffer, int64_t code) {
  return ffi::Error::InvalidArgument(
      "demo.Fail: refused on purpose (code=" + std::to_string(code) + ")");
}

ffi::Error ScratchSumImpl(ffi::ScratchAllocator scratch, Vector x,
                          ffi::Result<Vector> y) {
  const size_t n = x.element_count();
  if (y->element_count() != n) {
    return ffi::Error::InvalidArgument("demo.ScratchSum: output has " +
                                       std::to_string(y->element_count()) +
                                       " elements, input " + std::to_string(n));
  }
  if (n == 0) return ffi::Error::Success();
  std::optional<void*> tmp = scratch.Allocate(n * sizeof(float), 64);
  if (!tmp.has_value() || *tmp == nullptr) {
    return ffi::Error(
        ffi::ErrorCode::kResourceExhausted,
        "demo.ScratchSum: scratch allocation of " +
            std::to_string(n * sizeof(float)) +
            " bytes failed (the host's XLA_FFI_DeviceMemory_Allocate "
            "refused; in-process XLA:CPU offers handlers no scratch memory)");
  }
  float* prefix = static_cast<float*>(*tmp);
  const float* in = x.typed_data();
  float acc = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    acc += in[i];
    prefix[i] = acc;
  }
  std::memcpy(y->typed_data(), prefix, n * sizeof(float));
  return ffi::Error::Success();
}

// Validates synchronously, then scales on an XLA thread-pool thread and
// completes the returned future there. XLA keeps the buffers alive until the
// future is ready.
ffi::Future AsyncScaleImpl(ffi::ThreadPool pool, ffi::AnyBuffer x,
                           ffi::Result<ffi::AnyBuffer> y, Factor attr) {
  const float factor = AsFloat(attr);
  ffi::Promise promise;
  ffi::Future future(promise);
  if (ffi::Error err = CheckScaleOperands("demo.AsyncScale", x, *y);
      err.failure()) {
    promise.SetError(std::move(err));
    return future;
  }
  pool.Schedule([promise, dtype = x.element_type(), in = x.untyped_data(),
                 out = y->untyped_data(), n = x.element_count(),
                 factor]() mutable {
    ScaleElements(dtype, in, out, n, factor);
    promise.SetAvailable();
  });
  return future;
}

}  // namespace
}  // namespace kreg::kernels

KREG_EXPORT_HANDLER(Scale);
KREG_EXPORT_HANDLER(AddMul);
KREG_EXPORT_HANDLER(Fail);
KREG_EXPORT_HANDLER(ScratchSum);
KREG_EXPORT_HANDLER(AsyncScale);

XLA_FFI_DEFINE_HANDLER_SYMBOL(Scale, kreg::kernels::ScaleImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<kreg::kernels::Factor>("factor"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(AddMul, kreg::kernels::AddMulImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    Fail, kreg::kernels::FailImpl,
    ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Attr<int64_t>("code"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(ScratchSum, kreg::kernels::ScratchSumImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ScratchAllocator>()
                                  .Arg<kreg::kernels::Vector>()
                                  .Ret<kreg::kernels::Vector>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(AsyncScale, kreg::kernels::AsyncScaleImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<kreg::kernels::Factor>("factor"));
