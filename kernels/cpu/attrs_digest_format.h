// AttrsDigest's canonical text of an XLA FFI attribute dictionary, shared by
// the CPU (libdemo.so) and CUDA (libdemo_cuda.so) AttrsDigest handlers.
//
// Format (ASCII, no whitespace; grammar of one attribute dictionary):
//   dict   := "{" entry* "}"            entries in call-frame order
//   entry  := name "=" value ";"
//   value  := dtype ":" elem            scalar
//           | dtype "[" n "]:" elem ("," elem)*   dense array (n elements)
//           | "str[" n "]:" <n raw bytes>
//           | "dict" dict
//   elem   := decimal integer           s8..s64, u8..u64
//           | "true" | "false"          pred
//           | "0x" lower-case hex of the IEEE bits, zero-padded to the width
//                                       f16, bf16, f32, f64
//           | "(" bits "," bits ")"     c64, c128 (real, imaginary)
// dtype names are those of dtypes.h ("s32", "f32", "pred", ...). Names must
// be strictly increasing at each level, as XLA guarantees (ffi::Dictionary
// binary-searches them); otherwise serialisation fails with INVALID_ARGUMENT.

#ifndef KREGD_KERNELS_CPU_ATTRS_DIGEST_FORMAT_H_
#define KREGD_KERNELS_CPU_ATTRS_DIGEST_FORMAT_H_

#include <optional>
#include <string>

#include "xla/ffi/api/ffi.h"

namespace kreg::kernels {

// The raw attribute dictionary of a call frame. Bound with
// `.Attrs<RawAttrs>()`, i.e. through ffi.h's own dictionary-decoding hook, so
// that every attribute kind and dtype is visible, including those ffi.h has no
// typed decoder for (pred arrays, f16 arrays).
struct RawAttrs {
  const XLA_FFI_Attrs* attrs;
};

// The canonical text of `attrs`. INVALID_ARGUMENT if names are unsorted or an
// attribute type is unknown, UNIMPLEMENTED for a dtype without a format.
xla::ffi::ErrorOr<std::string> AttrsDigestText(const XLA_FFI_Attrs* attrs);

}  // namespace kreg::kernels

namespace xla::ffi {

template <>
struct AttrDecoding<kreg::kernels::RawAttrs> {
  using Type = kreg::kernels::RawAttrs;
  static std::optional<Type> Decode(XLA_FFI_AttrType type, void* attr,
                                    DiagnosticEngine& diagnostic) {
    if (type != XLA_FFI_AttrType_DICTIONARY) {
      return diagnostic.Emit("Wrong attribute type: expected dictionary");
    }
    return Type{static_cast<const XLA_FFI_Attrs*>(attr)};
  }
};

}  // namespace xla::ffi

#endif  // KREGD_KERNELS_CPU_ATTRS_DIGEST_FORMAT_H_
