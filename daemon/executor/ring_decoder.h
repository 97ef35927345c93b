// Edge validation of a launch descriptor (ring_layout.h), the one encoding
// of a launch: taken off the launch ring or carried by a socket Launch.
#ifndef KREGD_DAEMON_EXECUTOR_RING_DECODER_H_
#define KREGD_DAEMON_EXECUTOR_RING_DECODER_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/ring_layout.h"
#include "common/wire.h"
#include "daemon/executor/launch_fields.h"
#include "daemon/executor/shm_arena.h"
#include "kreg/v1/session.pb.h"

namespace kreg {

// What a descriptor's header says, once its framing was checked
// (RingDecoder::Header). The views point into the descriptor's bytes.
struct RingLaunchHeader {
  Platform platform = Platform::kCpu;
  absl::string_view target;
  // CUDA: the device (16 raw bytes), the doorbell sequence number (> 0 on
  // the ring; 0 on the socket: ordered by interprocess events).
  absl::string_view device_uuid;
  uint64_t doorbell_seq = 0;
  uint32_t flags = 0;       // ring::kSubmit* bits
  uint32_t generation = 0;  // pinned (docs/replace.md §7); 0: the current
  uint64_t state = 0;       // the call site's state handle; 0: none
};

// Decodes descriptors of one session. Keeps the last decoded launch (its
// vectors are reused) and the last kAttrEntries distinct attribute blocks
// with their decoded lists, so call sites whose attributes did not change
// skip parsing them, even when several alternate (the decoded list is a
// function of the bytes: the checks are the same). Each block's list keeps
// one attrs_generation for as long as it is cached, and is the same objects
// whenever the frame carries it (moved in and out, never copied), so
// FfiHost's CallFrameCache may keep what it built from it.
// Each cached block (its bytes and decoded list) is charged to `budget` (the
// executor's max_buffered_bytes, shared with the sessions' receive buffers;
// null: unbounded) before the cache keeps it, and given back when it is
// evicted or the decoder destroyed (the session ends). A block the budget
// cannot cover, even after evicting this decoder's other blocks, fails its
// launch with RESOURCE_EXHAUSTED naming max_buffered_bytes. (The transient
// decode of one descriptor is bounded by the descriptor's size.)
// A block larger than a ring slot (only a socket Launch carries one) is
// decoded every time, never cached (attrs_generation 0).
// Thread-compatible: one session uses it under its request lock (the ring
// thread and socket launches).
class RingDecoder {
 public:
  // `budget` must outlive the decoder.
  explicit RingDecoder(wire::ByteBudget* budget = nullptr) : budget_(budget) {}
  RingDecoder(const RingDecoder&) = delete;
  RingDecoder& operator=(const RingDecoder&) = delete;

  // Validates the descriptor `data` (`size` bytes, a private copy taken out
  // of shared memory: nothing here reads the ring) published at sq position
  // `seq`, or carried by a socket Launch (`seq` nullopt), against `arena`.
  // Every field is checked (target name, platform, buffer counts, dtypes,
  // ranks, dims, sizes, offsets inside the arena without overflow,
  // attributes, device ordinal; launch_fields.h), and the descriptor's own
  // framing: a header, `length` equal to the bytes published (else the
  // write was torn), `seq` (ring only), every length inside the descriptor
  // and no trailing bytes. INVALID_ARGUMENT / OUT_OF_RANGE naming the
  // field. A CUDA descriptor's buffers are resolved through `cuda`
  // (DecodeCudaBufferFields: its ref carries the header's device_uuid);
  // without `cuda` it is UNIMPLEMENTED ("serves no CUDA device").
  // `*tag` gets the descriptor's tag when its header was complete (else 0).
  // The result stays valid until the next call or until `arena` changes.
  // `shapes_only` (a StageCall's descriptor, session.proto): every buffer
  // carries its dtype and dims only (offset 0, an all-zero CudaRef; else
  // INVALID_ARGUMENT) and is decoded with a null data pointer, on any
  // platform (`cuda` is not needed).
  absl::StatusOr<DecodedLaunch*> Decode(
      const char* data, size_t size, std::optional<uint32_t> seq,
      const ShmArena& arena, uint64_t* tag,
      const CudaBufferResolver* cuda = nullptr, bool shapes_only = false);

  // Only the header and framing of the descriptor (Decode's first checks):
  // size, `length`, `seq`, reserved bits and flags, target name, platform,
  // and the platform's header fields (a CPU descriptor has no CUDA fields;
  // a CUDA one on the ring has a doorbell_seq > 0). The same errors as
  // Decode.
  absl::StatusOr<RingLaunchHeader> Header(const char* data, size_t size,
                                          std::optional<uint32_t> seq,
                                          uint64_t* tag) const;

  // Bytes the cached attribute blocks hold of the budget.
  uint64_t charged_bytes() const;

 private:
  static constexpr size_t kAttrEntries = 16;

  // An attribute block and its decoded list.
  struct AttrEntry {
    std::string bytes;
    AttrList attrs;  // empty while launch_.frame.attrs holds it
    uint64_t generation = 0;
    uint64_t used = 0;
    bool valid = false;     // false: evicted (or never filled)
    wire::BudgetHold hold;  // what bytes and attrs are charged
  };

  absl::Status DecodeAttrBytes(const char* data, size_t size);
  // Puts entry `i`'s list into the frame (and the current one's back).
  void UseEntry(size_t i);
  // Frees entry `i` (never the current one) and gives its charge back.
  void Evict(size_t i);
  // Charges `need` bytes to entry `slot`, evicting the least recently used
  // other entries (never the current one) while the budget cannot cover it.
  absl::Status Charge(size_t slot, uint64_t need);

  wire::ByteBudget* const budget_;

  // Header's checks, filling `*h` and `*out`; `*pos` gets the offset after
  // the platform text.
  absl::Status CheckHeader(const char* data, size_t size,
                           std::optional<uint32_t> seq, uint64_t* tag,
                           ring::SubmitHeader* h, RingLaunchHeader* out,
                           size_t* pos) const;

  DecodedLaunch launch_;
  std::string device_uuid_;  // of the CUDA descriptor decoded last
  std::vector<AttrEntry> attr_entries_;
  int current_ = -1;  // the entry whose list launch_.frame.attrs holds
  uint64_t clock_ = 0;
  v1::AttributeBlock attr_message_;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_RING_DECODER_H_
