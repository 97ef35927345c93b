// Test helpers shared by the launch decoder tests: an arena to decode
// against and a descriptor decoded as a socket Launch carries it.
#ifndef KREGD_TESTS_DAEMON_EXECUTOR_DECODE_FIXTURE_H_
#define KREGD_TESTS_DAEMON_EXECUTOR_DECODE_FIXTURE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "catch2/catch.hpp"
#include "daemon/executor/ring_decoder.h"
#include "daemon/executor/shm_arena.h"
#include "tests/daemon/executor/test_util.h"
#include "tests/testing/launch_spec.h"

namespace kreg::testing {

// A session arena of 4096 bytes (the limit is 1 MiB).
struct Arena {
  Arena() : arena(1 << 20) {
    REQUIRE(arena.Replace(MakeMemfd(4096), 4096).ok());
  }
  ShmArena arena;
};

// `l` encoded as a descriptor and decoded as a socket Launch's (a fresh
// decoder), CUDA buffers resolved through `cuda`.
inline absl::StatusOr<DecodedLaunch> SocketDecode(
    const LaunchSpec& l, const ShmArena& arena,
    const CudaBufferResolver* cuda = nullptr) {
  RingDecoder decoder;
  const std::string bytes = EncodeSpec(l, 0, 42);
  uint64_t tag;
  absl::StatusOr<DecodedLaunch*> d = decoder.Decode(
      bytes.data(), bytes.size(), std::nullopt, arena, &tag, cuda);
  if (!d.ok()) return d.status();
  return **d;
}

}  // namespace kreg::testing

#endif  // KREGD_TESTS_DAEMON_EXECUTOR_DECODE_FIXTURE_H_
