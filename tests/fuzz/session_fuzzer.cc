// Fuzzes a session's request path end to end in one process: the bytes go
// through a socketpair into Session::Run (wire::RecvFrame framing, then
// SessionRequest parsing and Session::Handle) over a fake backend whose
// handler touches every buffer it is given.
//
// Input: byte 0 selects a prelude; the rest is written raw to the socket.
//   bit 0: a Hello first; bit 1: also an ArenaGrow with a sealed 64 KiB
//   memfd (so fuzzed launches reach the decoder and the handler).
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <thread>

#include "common/wire.h"
#include "daemon/executor/session.h"
#include "tests/fuzz/buffer_check.h"
#include "tests/fuzz/fuzz_util.h"

namespace kreg {
namespace {

constexpr uint64_t kArenaBytes = 64 << 10;

class FakeBackend : public SessionBackend {
 public:
  absl::StatusOr<ResolvedHandler> Lookup(const TargetKey& key,
                                         uint32_t) override {
    if (key.name.empty() || key.name[0] != 't') {
      return absl::NotFoundError("not registered");
    }
    return ResolvedHandler{reinterpret_cast<void*>(0x1)};
  }
  absl::Status Execute(void*, const LaunchFrame& frame) override {
    if (frame.platform == Platform::kCpu) {
      // The arena is the one memfd of the prelude; any CPU buffer must lie
      // in a mapping of it, which the fuzzer cannot see: touching every
      // byte makes a stray pointer fault.
      for (const auto* list : {&frame.args, &frame.rets}) {
        for (const BufferRef& b : *list) {
          uint64_t n = fuzz::BufferBytes(b);
          if (n > kArenaBytes) fuzz::Fail("buffer larger than the arena");
          if (n > 0) std::memset(b.data, 0x5a, n);
        }
      }
    }
    return absl::OkStatus();
  }
  uint32_t ffi_api_major() const override { return 0; }
  uint32_t ffi_api_minor() const override { return 4; }
};

void SendRequest(int sock, const v1::SessionRequest& r, int fd = -1) {
  std::string out = r.SerializeAsString();
  if (wire::SendFrame(sock, out.data(), out.size(), &fd, fd >= 0 ? 1 : 0) !=
      wire::kOk) {
    fuzz::Fail("prelude send");
  }
}

}  // namespace
}  // namespace kreg

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kreg::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kreg;
  if (size == 0 || size > (128 << 10)) return 0;  // must fit socket buffers
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    fuzz::Fail("socketpair");
  }
  UniqueFd client(sv[1]);
  if (data[0] & 1) {
    v1::SessionRequest hello;
    hello.set_id(1);
    hello.mutable_hello()->set_protocol_major(kSessionProtocolMajor);
    hello.mutable_hello()->set_protocol_minor(kSessionProtocolMinor);
    SendRequest(client.get(), hello);
    if (data[0] & 2) {
      v1::SessionRequest grow;
      grow.set_id(2);
      grow.mutable_arena_grow()->set_size(kArenaBytes);
      UniqueFd memfd = fuzz::SealedMemfd(kArenaBytes);
      SendRequest(client.get(), grow, memfd.get());
    }
  }
  // Everything is written before the session starts reading (it fits in the
  // socket buffer); a thread drains the replies so the session never blocks.
  const uint8_t* p = data + 1;
  size_t left = size - 1;
  while (left > 0) {
    ssize_t n = ::send(client.get(), p, left, MSG_NOSIGNAL);
    if (n <= 0) fuzz::Fail("send");
    p += n;
    left -= static_cast<size_t>(n);
  }
  ::shutdown(client.get(), SHUT_WR);
  std::thread drain([&client] {
    char buf[4096];
    while (::read(client.get(), buf, sizeof(buf)) > 0) {
    }
  });
  FakeBackend backend;
  SessionCounters counters;
  SessionLimits limits;
  limits.max_arena_bytes = 1 << 20;
  limits.max_message_bytes = 1 << 20;
  limits.max_module_bytes = 1 << 20;
  {
    Session session(1, UniqueFd(sv[0]), PeerCred{1000, 1000, 42}, limits,
                    &backend, &counters);
    session.Run();
  }
  drain.join();
  return 0;
}
