// Symbol export for kernel modules built with -fvisibility=hidden.
//
// XLA_FFI_DEFINE_HANDLER_SYMBOL defines an `extern "C"` function but does not
// mark it visible, so each module declares its handlers with
// KREG_EXPORT_HANDLER first; GCC and Clang carry the visibility of the first
// declaration over to the definition. Everything else stays hidden.

#ifndef KREGD_KERNELS_CPU_EXPORT_H_
#define KREGD_KERNELS_CPU_EXPORT_H_

#include "xla/ffi/api/c_api.h"

#define KREG_EXPORT __attribute__((visibility("default")))

// Declares the exported XLA FFI handler symbol `fn`.
#define KREG_EXPORT_HANDLER(fn) \
  extern "C" KREG_EXPORT XLA_FFI_Error* fn(XLA_FFI_CallFrame* call_frame)

#endif  // KREGD_KERNELS_CPU_EXPORT_H_
