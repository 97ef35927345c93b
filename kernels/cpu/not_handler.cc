// libnot_handler.so, a registration-test fixture:
//   NotAHandler     has the handler signature but ignores the FFI protocol: it
//                   returns success without filling the metadata.
//   plain_function  an ordinary C function, not a handler at all.
//   Ok              a genuine handler (same contract as demo's Scale).

#include "kernels/cpu/export.h"
#include "kernels/cpu/scale.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

extern "C" KREG_EXPORT XLA_FFI_Error* NotAHandler(XLA_FFI_CallFrame*) {
  return nullptr;
}

extern "C" KREG_EXPORT int plain_function(int x) { return x + 1; }

namespace {

ffi::Error OkImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                  float factor) {
  return kreg::kernels::ScaleBuffer("not_handler.Ok", x, *y, factor);
}

}  // namespace

KREG_EXPORT_HANDLER(Ok);

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    Ok, OkImpl,
    ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>().Attr<float>(
        "factor"));
