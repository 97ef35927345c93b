// libhang_ctor.so, a registration-test fixture: a static constructor says so
// on stderr and then sleeps for a minute, longer than kregd's 20 s probe
// limit. It exports a genuine `Scale` handler so that only the constructor
// can explain a refusal.

#include <unistd.h>

#include <cstdio>

#include "kernels/cpu/export.h"
#include "kernels/cpu/scale.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

__attribute__((constructor)) void HangOnLoad() {
  std::fputs("libhang_ctor.so: hanging in a static constructor on purpose\n",
             stderr);
  std::fflush(stderr);
  ::sleep(60);
}

ffi::Error ScaleImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                     float factor) {
  return kreg::kernels::ScaleBuffer("hang_ctor.Scale", x, *y, factor);
}

}  // namespace

KREG_EXPORT_HANDLER(Scale);

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    Scale, ScaleImpl,
    ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>().Attr<float>(
        "factor"));
