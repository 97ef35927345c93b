// An XLA FFI handler to compile with kreg.compile_ffi_target or
// `kregctl compile` (docs/user-guide.md, "Compile once"): y = a * x + b,
// elementwise, with `a` an attribute (F64, what a Python float passes) and
// b = 0.5 unless -DAXPB_B=... is given.
#include <cstddef>

#include "xla/ffi/api/ffi.h"

#ifndef AXPB_B
#define AXPB_B 0.5f
#endif

namespace ffi = xla::ffi;

static ffi::Error Axpb(ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> y,
                       double a) {
  for (size_t i = 0; i < x.element_count(); ++i) {
    y->typed_data()[i] = static_cast<float>(a) * x.typed_data()[i] + AXPB_B;
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(AxpbHandler, Axpb,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<double>("a"));
