// Registration-test fixtures whose static constructor misbehaves on purpose;
// each exports a genuine `Scale` handler so that only the constructor, never
// a missing symbol, can explain a refusal. Never load them into a process
// you care about.
// - libcrash_ctor.so: the constructor aborts the process that loads it.
// - libhang_ctor.so (KREG_CTOR_HANGS): it says so on stderr, then sleeps for
//   a minute, longer than kregd's default 20 s probe limit; or, when
//   $KREG_TEST_HANG_UNTIL names a file, until that file exists.

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "kernels/cpu/export.h"
#include "kernels/cpu/scale.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

__attribute__((constructor)) void MisbehaveOnLoad() {
#ifdef KREG_CTOR_HANGS
  std::fputs("libhang_ctor.so: hanging in a static constructor on purpose\n",
             stderr);
  std::fflush(stderr);
  const char* until = std::getenv("KREG_TEST_HANG_UNTIL");
  struct stat st;
  if (until == nullptr) {
    ::sleep(60);
  } else {
    while (::stat(until, &st) != 0) ::usleep(10000);
  }
#else
  std::fputs("libcrash_ctor.so: aborting in a static constructor on purpose\n",
             stderr);
  std::abort();
#endif
}

ffi::Error ScaleImpl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                     float factor) {
  return kreg::kernels::ScaleBuffer("bad_ctor.Scale", x, *y, factor);
}

}  // namespace

KREG_EXPORT_HANDLER(Scale);

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    Scale, ScaleImpl,
    ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>().Attr<float>(
        "factor"));
