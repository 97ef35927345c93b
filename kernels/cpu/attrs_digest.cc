// libdemo.so: AttrsDigest, a deterministic serialisation of every attribute
// of the call (format: attrs_digest_format.h), written into a U8 result
// buffer and zero-padded. Tests compare the bytes from an in-process call with
// those from a forwarded call.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "kernels/cpu/attrs_digest_format.h"
#include "kernels/cpu/export.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace kreg::kernels {
namespace {

ffi::Error AttrsDigestImpl(ffi::RemainingArgs, RawAttrs attrs,
                           ffi::Result<ffi::Buffer<ffi::U8>> out) {
  ffi::ErrorOr<std::string> text = AttrsDigestText(attrs.attrs);
  if (text.has_error()) return text.error();
  const std::string& digest = *text;
  const size_t capacity = out->element_count();
  if (digest.size() > capacity) {
    return ffi::Error::InvalidArgument(
        "AttrsDigest: output has " + std::to_string(capacity) +
        " bytes, the digest needs " + std::to_string(digest.size()));
  }
  uint8_t* dst = out->typed_data();
  if (!digest.empty()) std::memcpy(dst, digest.data(), digest.size());
  if (capacity > digest.size()) {
    std::memset(dst + digest.size(), 0, capacity - digest.size());
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace kreg::kernels

KREG_EXPORT_HANDLER(AttrsDigest);

XLA_FFI_DEFINE_HANDLER_SYMBOL(AttrsDigest, kreg::kernels::AttrsDigestImpl,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()
                                  .Attrs<kreg::kernels::RawAttrs>()
                                  .Ret<ffi::Buffer<ffi::U8>>());
