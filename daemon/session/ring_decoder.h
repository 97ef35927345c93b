// Edge validation of a launch-ring descriptor (ring_layout.h): the same
// checks and messages as DecodeLaunch applies to a socket Launch.
#ifndef KREGD_DAEMON_SESSION_RING_DECODER_H_
#define KREGD_DAEMON_SESSION_RING_DECODER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/session/launch_decoder.h"
#include "daemon/session/shm_arena.h"
#include "kreg/v1/session.pb.h"

namespace kreg {

// Decodes descriptors of one session. Keeps the last decoded launch (its
// vectors are reused) and the last attribute bytes with their decoded list,
// so a call site whose attributes did not change skips parsing them (the
// decoded list is a function of the bytes: the checks are the same).
// Thread-compatible: one session's ring thread uses it.
class RingDecoder {
 public:
  RingDecoder() = default;
  RingDecoder(const RingDecoder&) = delete;
  RingDecoder& operator=(const RingDecoder&) = delete;

  // Validates the descriptor `data` (`size` bytes, a private copy taken out
  // of shared memory: nothing here reads the ring) published at sq position
  // `seq`, against `arena`. Every field gets DecodeLaunch's check (target
  // name, platform, buffer counts, dtypes, ranks, dims, sizes, offsets inside
  // the arena without overflow, attributes, device ordinal), plus the
  // descriptor's own framing: a header, `length` equal to the bytes
  // published (else the write was torn), `seq`, every length inside the
  // descriptor and no trailing bytes. INVALID_ARGUMENT / OUT_OF_RANGE naming
  // the field; UNIMPLEMENTED for a CUDA launch (those use the socket).
  // `*tag` gets the descriptor's tag when its header was complete (else 0).
  // The result stays valid until the next call or until `arena` changes.
  absl::StatusOr<const DecodedLaunch*> Decode(const char* data, size_t size,
                                              uint32_t seq,
                                              const ShmArena& arena,
                                              uint64_t* tag);

 private:
  absl::Status DecodeAttrBytes(const char* data, size_t size);

  DecodedLaunch launch_;
  std::string attr_bytes_;  // what launch_.frame.attrs was decoded from
  bool attrs_valid_ = false;
  v1::Launch attr_message_;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_SESSION_RING_DECODER_H_
