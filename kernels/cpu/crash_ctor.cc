// libcrash_ctor.so, a registration-test fixture: a static constructor aborts
// the process that loads it. It exports a genuine `Scale` handler so that
// only the constructor, never a missing symbol, can explain a failure.
// Never load it into a process you care about.

#include <cstdio>
#include <cstdlib>

#include "kernels/cpu/export.h"
#include "kernels/cpu/scale.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

__attribute__((constructor)) void AbortOnLoad() {
  std::fputs("libcrash_ctor.so: aborting in a static constructor on purpose\n",
             stderr);
  std::abort();
}

ffi::Error ScaleImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                     float factor) {
  return kreg::kernels::ScaleBuffer("crash_ctor.Scale", x, *y, factor);
}

}  // namespace

KREG_EXPORT_HANDLER(Scale);

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    Scale, ScaleImpl,
    ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>().Attr<float>(
        "factor"));
