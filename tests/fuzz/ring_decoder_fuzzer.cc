// Fuzzes RingDecoder::Decode, the executor's edge for launch-ring
// descriptors (a client may write anything into its ring slots at any
// time). Input: 4 bytes of the expected sequence number, then the
// descriptor bytes. Each input is decoded twice by one decoder (the second
// pass exercises its attribute cache) and once by a fresh one; every
// decoded CPU buffer must lie inside the arena and is read or written in
// full, and the two decoders must agree.
#include <cstdint>
#include <cstring>

#include "daemon/session/ring_decoder.h"
#include "tests/fuzz/buffer_check.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

constexpr uint64_t kArenaBytes = 64 << 10;

kreg::ShmArena* Arena() {
  static kreg::ShmArena* arena = [] {
    auto* a = new kreg::ShmArena(1 << 20);
    if (!a->Replace(kreg::fuzz::SealedMemfd(kArenaBytes), kArenaBytes).ok()) {
      kreg::fuzz::Fail("arena");
    }
    return a;
  }();
  return arena;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kreg::fuzz::QuietLogs();
  Arena();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint32_t seq;
  std::memcpy(&seq, data, 4);
  const char* desc = reinterpret_cast<const char*>(data + 4);
  const size_t len = size - 4;
  kreg::ShmArena* arena = Arena();
  static kreg::RingDecoder* cached = new kreg::RingDecoder();
  kreg::RingDecoder fresh;
  uint64_t tag_fresh = 0;
  absl::StatusOr<const kreg::DecodedLaunch*> want =
      fresh.Decode(desc, len, seq, *arena, &tag_fresh);
  for (int pass = 0; pass < 2; ++pass) {
    uint64_t tag = 0;
    absl::StatusOr<const kreg::DecodedLaunch*> d =
        cached->Decode(desc, len, seq, *arena, &tag);
    if (d.ok() != want.ok() || tag != tag_fresh) {
      kreg::fuzz::Fail("the attribute cache changed a decoding");
    }
    if (!d.ok()) {
      if (d.status().message().empty()) kreg::fuzz::Fail("error without text");
      if (d.status() != want.status()) kreg::fuzz::Fail("errors differ");
      continue;
    }
    absl::StatusOr<char*> base = arena->Region(0, 0);
    kreg::fuzz::CheckCpuFrame((*d)->frame, *base, arena->size());
    if ((*d)->frame.attrs.size() != (*want)->frame.attrs.size() ||
        (*d)->key.name != (*want)->key.name) {
      kreg::fuzz::Fail("the attribute cache changed a decoding");
    }
  }
  return 0;
}
