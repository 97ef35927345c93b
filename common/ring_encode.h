// Encodes a kreg.v1.Launch as a launch-ring descriptor (ring_layout.h).
// Header-only and templated on the message type, so the shim (its own
// protobuf-lite build of session.proto) and kregd's tests share one encoder.
#ifndef KREGD_COMMON_RING_ENCODE_H_
#define KREGD_COMMON_RING_ENCODE_H_

#include <string.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/ring_layout.h"

namespace kreg {
namespace ring {

// `launch.attrs()` as the protobuf encoding of a Launch holding only them
// (repeated field 5, length-delimited), into `out`.
template <typename LaunchT>
void EncodeAttrBytes(const LaunchT& launch, std::string* out) {
  out->clear();
  for (const auto& a : launch.attrs()) {
    out->push_back(static_cast<char>((5 << 3) | 2));
    const uint64_t n = a.ByteSizeLong();
    uint64_t v = n;
    for (; v >= 0x80; v >>= 7) out->push_back(static_cast<char>(v | 0x80));
    out->push_back(static_cast<char>(v));
    size_t at = out->size();
    out->resize(at + n);
    a.SerializeWithCachedSizesToArray(
        reinterpret_cast<uint8_t*>(out->data() + at));
  }
}

// Writes the descriptor of `launch` (seq, tag; attribute bytes `attrs`
// from EncodeAttrBytes) into `slot` of `capacity` bytes. Returns its length,
// or 0 when it does not fit (nothing useful written).
template <typename LaunchT>
size_t EncodeDescriptor(const LaunchT& launch, uint32_t seq, uint64_t tag,
                        const std::string& attrs, char* slot, size_t capacity) {
  const auto& target = launch.target_name();
  const auto& platform = launch.platform();
  size_t need = sizeof(SubmitHeader) + target.size() + platform.size();
  need = (need + 7) / 8 * 8;
  for (const auto* list : {&launch.args(), &launch.rets()}) {
    for (const auto& b : *list) {
      need += sizeof(BufferDesc) + size_t(b.dims_size()) * sizeof(int64_t);
    }
  }
  need += attrs.size();
  if (need > capacity) return 0;
  SubmitHeader h{};
  h.length = static_cast<uint32_t>(need);
  h.seq = seq;
  h.tag = tag;
  h.run_id = launch.run_id();
  h.device_ordinal = launch.device_ordinal();
  h.num_args = static_cast<uint32_t>(launch.args_size());
  h.num_rets = static_cast<uint32_t>(launch.rets_size());
  h.target_len = static_cast<uint32_t>(target.size());
  h.platform_len = static_cast<uint32_t>(platform.size());
  h.attrs_len = static_cast<uint32_t>(attrs.size());
  char* p = slot;
  memcpy(p, &h, sizeof(h));
  p += sizeof(h);
  memcpy(p, target.data(), target.size());
  p += target.size();
  memcpy(p, platform.data(), platform.size());
  p += platform.size();
  while ((p - slot) % 8 != 0) *p++ = 0;
  for (const auto* list : {&launch.args(), &launch.rets()}) {
    for (const auto& b : *list) {
      BufferDesc d{b.dtype(), static_cast<uint32_t>(b.dims_size()), b.offset(),
                   b.size()};
      memcpy(p, &d, sizeof(d));
      p += sizeof(d);
      size_t dims = size_t(b.dims_size()) * sizeof(int64_t);
      if (dims > 0) memcpy(p, b.dims().data(), dims);
      p += dims;
    }
  }
  if (!attrs.empty()) memcpy(p, attrs.data(), attrs.size());
  return need;
}

}  // namespace ring
}  // namespace kreg

#endif  // KREGD_COMMON_RING_ENCODE_H_
