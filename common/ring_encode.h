// Encodes launch descriptors (ring_layout.h), for a ring slot or a socket
// Launch. Header-only and libc only. The shim encodes a DescriptorView
// built straight from XLA's call frame (no protobuf but the attribute
// bytes, which it caches per call site).
#ifndef KREGD_COMMON_RING_ENCODE_H_
#define KREGD_COMMON_RING_ENCODE_H_

#include <string.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/ring_layout.h"

namespace kreg {
namespace ring {

// One arg or ret of a descriptor; `dims` holds `rank` values (borrowed).
struct BufferView {
  int32_t dtype = 0;
  uint32_t rank = 0;
  const int64_t* dims = nullptr;
  uint64_t offset = 0;
  uint64_t size = 0;
  CudaRef cuda{};  // platform "cuda": the buffer's allocation
};

// Everything a descriptor carries but its seq and tag; all borrowed.
// `attrs` are a kreg.v1.AttributeBlock's encoding (the shim's AttrCache).
struct DescriptorView {
  std::string_view target;
  std::string_view platform;
  const BufferView* args = nullptr;
  uint32_t num_args = 0;
  const BufferView* rets = nullptr;
  uint32_t num_rets = 0;
  std::string_view attrs;
  int64_t run_id = 0;
  int32_t device_ordinal = 0;
  // Platform "cuda" only: the device (16 raw bytes; fewer are zero-padded),
  // the doorbell sequence number and kSubmit* flags.
  std::string_view device_uuid;
  uint64_t doorbell_seq = 0;
  uint32_t flags = 0;
  uint32_t generation = 0;  // pinned (docs/replace.md §7); 0: the current
  uint64_t state = 0;       // the call site's state handle; 0: none
};

// Whether descriptors of `platform` carry a CudaRef per buffer.
inline bool HasCudaRefs(std::string_view platform) {
  return platform == "cuda";
}

// Bytes the descriptor of `d` takes.
inline size_t DescriptorBytes(const DescriptorView& d) {
  size_t need = sizeof(SubmitHeader) + d.target.size() + d.platform.size();
  need = (need + 7) / 8 * 8;
  const size_t per_buffer =
      sizeof(BufferDesc) + (HasCudaRefs(d.platform) ? sizeof(CudaRef) : 0);
  for (uint32_t i = 0; i < d.num_args + d.num_rets; ++i) {
    const BufferView& b = i < d.num_args ? d.args[i] : d.rets[i - d.num_args];
    need += per_buffer + size_t{b.rank} * sizeof(int64_t);
  }
  return need + d.attrs.size();
}

// Writes the descriptor of `d` (seq, tag) into `slot` of `capacity` bytes.
// Returns its length, or 0 when it does not fit (nothing written).
inline size_t EncodeDescriptor(const DescriptorView& d, uint32_t seq,
                               uint64_t tag, char* slot, size_t capacity) {
  const size_t need = DescriptorBytes(d);
  if (need > capacity) return 0;
  SubmitHeader h{};
  h.length = static_cast<uint32_t>(need);
  h.seq = seq;
  h.tag = tag;
  h.run_id = d.run_id;
  h.device_ordinal = d.device_ordinal;
  h.num_args = d.num_args;
  h.num_rets = d.num_rets;
  h.target_len = static_cast<uint32_t>(d.target.size());
  h.platform_len = static_cast<uint32_t>(d.platform.size());
  h.attrs_len = static_cast<uint32_t>(d.attrs.size());
  h.doorbell_seq = d.doorbell_seq;
  memcpy(h.device_uuid, d.device_uuid.data(),
         d.device_uuid.size() < sizeof(h.device_uuid) ? d.device_uuid.size()
                                                      : sizeof(h.device_uuid));
  h.flags = d.flags;
  h.generation = d.generation;
  h.state = d.state;
  const bool refs = HasCudaRefs(d.platform);
  char* p = slot;
  memcpy(p, &h, sizeof(h));
  p += sizeof(h);
  memcpy(p, d.target.data(), d.target.size());
  p += d.target.size();
  memcpy(p, d.platform.data(), d.platform.size());
  p += d.platform.size();
  while ((p - slot) % 8 != 0) *p++ = 0;
  for (uint32_t i = 0; i < d.num_args + d.num_rets; ++i) {
    const BufferView& b = i < d.num_args ? d.args[i] : d.rets[i - d.num_args];
    BufferDesc desc{b.dtype, b.rank, b.offset, b.size};
    memcpy(p, &desc, sizeof(desc));
    p += sizeof(desc);
    if (refs) {
      memcpy(p, &b.cuda, sizeof(b.cuda));
      p += sizeof(b.cuda);
    }
    const size_t dims = size_t{b.rank} * sizeof(int64_t);
    if (dims > 0) memcpy(p, b.dims, dims);
    p += dims;
  }
  if (!d.attrs.empty()) memcpy(p, d.attrs.data(), d.attrs.size());
  return need;
}

// The descriptor of `d` as the whole of `*out` (a socket Launch's
// descriptor: seq and tag 0).
inline void EncodeDescriptor(const DescriptorView& d, std::string* out) {
  out->resize(DescriptorBytes(d));
  EncodeDescriptor(d, 0, 0, out->data(), out->size());
}

}  // namespace ring
}  // namespace kreg

#endif  // KREGD_COMMON_RING_ENCODE_H_
