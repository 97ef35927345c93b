// The launch ring end to end against a Session: SPSC order, wraparound,
// pipelining, synchronous errors, garbage and torn descriptors, impossible
// indices, and a client that dies mid-write.
#include "daemon/executor/launch_ring.h"

#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "common/ring_layout.h"
#include "common/wire.h"
#include "daemon/executor/ffi/ffi_host.h"
#include "daemon/executor/session.h"
#include "tests/daemon/executor/test_util.h"
#include "tests/testing/launch_spec.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace {

using ::kreg::testing::EncodeSpec;
using ::kreg::testing::LaunchSpec;
using ::kreg::testing::MakeMemfd;
constexpr uint64_t kArenaBytes = 1 << 16;

// "t": ret 0 = 2 * arg 0 (F32); with an attribute "fail", a 10000-byte
// error message. Other targets: NOT_FOUND.
class Backend : public SessionBackend {
 public:
  absl::StatusOr<ResolvedHandler> Lookup(const TargetKey& key,
                                         uint32_t) override {
    if (key.name != "t")
      return absl::NotFoundError("not registered: " + key.name);
    return ResolvedHandler{reinterpret_cast<void*>(0x1)};
  }
  absl::Status Execute(void*, const LaunchFrame& f) override {
    if (!f.attrs.empty() && f.attrs[0].first == "fail") {
      return absl::InternalError(std::string(10000, 'x'));
    }
    auto* in = static_cast<float*>(f.args[0].data);
    auto* out = static_cast<float*>(f.rets[0].data);
    for (int64_t i = 0; i < f.args[0].dims[0]; ++i) out[i] = 2 * in[i];
    executed.fetch_add(1);
    return absl::OkStatus();
  }
  // With `host` set, launches run ScaleByFactor through that real FfiHost
  // (with the session's call frame cache) instead of Execute's doubling.
  absl::Status ExecuteWith(void* handler, const LaunchFrame& f,
                           const CallOptions& options) override {
    if (host == nullptr) return Execute(handler, f);
    executed.fetch_add(1);
    return host->Execute(reinterpret_cast<void*>(&ScaleByFactor), f, options);
  }
  uint32_t ffi_api_major() const override { return 0; }
  uint32_t ffi_api_minor() const override { return 4; }
  std::atomic<int> executed{0};
  FfiHost* host = nullptr;

 private:
  // ret 0 = factor * arg 0 (F32, rank 1), `factor` an F32 scalar attribute.
  static XLA_FFI_Error* ScaleByFactor(XLA_FFI_CallFrame* f) {
    float factor = 0;
    for (int64_t i = 0; i < f->attrs.size; ++i) {
      const XLA_FFI_ByteSpan* name = f->attrs.names[i];
      if (std::string(name->ptr, name->len) == "factor") {
        auto* s = static_cast<XLA_FFI_Scalar*>(f->attrs.attrs[i]);
        memcpy(&factor, s->value, sizeof(factor));
      }
    }
    auto* in = static_cast<XLA_FFI_Buffer*>(f->args.args[0]);
    auto* out = static_cast<XLA_FFI_Buffer*>(f->rets.rets[0]);
    for (int64_t i = 0; i < in->dims[0]; ++i) {
      static_cast<float*>(out->data)[i] =
          factor * static_cast<float*>(in->data)[i];
    }
    return nullptr;
  }
};

SessionLimits Limits() {
  SessionLimits l;
  l.max_arena_bytes = 1 << 20;
  l.launch_ring = true;
  l.ring_spin_us = 20;
  return l;
}

LaunchSpec Doubling(uint64_t in, uint64_t out, int n = 4) {
  LaunchSpec l;
  l.set_target_name("t");
  l.set_platform("cpu");
  for (auto* b : {l.add_args(), l.add_rets()}) {
    b->set_dtype(XLA_FFI_DataType_F32);
    b->add_dims(n);
    b->set_size(4 * n);
  }
  l.mutable_args(0)->set_offset(in);
  l.mutable_rets(0)->set_offset(out);
  return l;
}

// Doubling(), with an F32 scalar attribute `factor` and a string `tag`.
LaunchSpec Scaling(float factor, const std::string& tag = "t") {
  LaunchSpec l = Doubling(0, 64);
  v1::Attribute* a = l.add_attrs();
  a->set_name("factor");
  a->set_kind(v1::ATTR_KIND_SCALAR);
  a->set_dtype(XLA_FFI_DataType_F32);
  a->set_data(&factor, sizeof(factor));
  v1::Attribute* t = l.add_attrs();
  t->set_name("tag");
  t->set_kind(v1::ATTR_KIND_STRING);
  t->set_data(tag);
  return l;
}

void* MapFd(int fd, size_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  REQUIRE(p != MAP_FAILED);
  return p;
}

// Encodes `l` into `slot` (ring::kSubmitSlotBytes) as a client does, but
// byte by byte with relaxed atomic stores: the scribbler tests rewrite the
// same slot bytes from another thread on purpose (a hostile client), and
// plain stores into this process's mapping would make that a data race in
// the test itself (TSan). The session reads through its own mapping and
// copies the slot before decoding, so torn copies are refused there.
// Returns the encoded size, 0 if it does not fit.
size_t EncodeIntoSlot(const LaunchSpec& l, uint32_t seq, uint64_t tag,
                      char* slot) {
  const std::string bytes = EncodeSpec(l, seq, tag);
  const size_t n = bytes.size() <= ring::kSubmitSlotBytes ? bytes.size() : 0;
  for (size_t i = 0; i < n; ++i) {
    __atomic_store_n(slot + i, bytes[i], __ATOMIC_RELAXED);
  }
  return n;
}

// The client's side, written against ring_layout.h only.
struct Client {
  Client() {
    arena_fd = MakeMemfd(kArenaBytes);
    arena = static_cast<char*>(MapFd(arena_fd.get(), kArenaBytes));
    ring_fd = MakeMemfd(ring::kRegionBytes);
    base = static_cast<char*>(MapFd(ring_fd.get(), ring::kRegionBytes));
  }
  ~Client() {
    ::munmap(arena, kArenaBytes);
    ::munmap(base, ring::kRegionBytes);
  }
  ring::Control* c() { return ring::ControlOf(base); }
  // Starts both indices at `index` (before RingSetup).
  void StartAt(uint32_t index) {
    tail = head = index;
    ring::Store(c()->sq_tail, index);
    ring::Store(c()->cq_head, index);
  }
  void Publish() {
    ++tail;
    ring::Store(c()->sq_tail, tail);
    if (ring::Load(c()->sq_waiting) != 0) ring::FutexWake(&c()->sq_tail);
  }
  void Submit(const LaunchSpec& l, uint64_t tag) {
    REQUIRE(EncodeIntoSlot(l, tail, tag, ring::SubmitSlot(base, tail)) > 0);
    Publish();
  }
  // Waits up to 10 s for the next completion.
  bool Await(int* code, std::string* message, uint64_t* tag = nullptr) {
    int64_t deadline = ring::NowNs() + 10'000'000'000;
    ring::SpinPolicy spin(10'000);
    while (ring::Load(c()->cq_tail) == head) {
      if (ring::NowNs() > deadline) return false;
      ring::SpinThenWait(&c()->cq_tail, head, &c()->cq_waiting, &spin,
                         10'000'000);
    }
    ring::CompletionHeader h;
    const char* slot = ring::CompleteSlot(base, head);
    memcpy(&h, slot, sizeof(h));
    *code = h.code;
    message->assign(slot + sizeof(h), h.message_len);
    if (tag != nullptr) *tag = h.tag;
    CHECK(h.seq == head);
    ++head;
    ring::Store(c()->cq_head, head);
    return true;
  }
  float* floats(uint64_t offset) {
    return reinterpret_cast<float*>(arena + offset);
  }
  UniqueFd arena_fd, ring_fd;
  char* arena;
  char* base;
  uint32_t tail = 0, head = 0;
};

v1::SessionRequest HelloRequest() {
  v1::SessionRequest r;
  r.set_id(1);
  r.mutable_hello()->set_protocol_major(kSessionProtocolMajor);
  r.mutable_hello()->set_protocol_minor(kSessionProtocolMinor);
  return r;
}
v1::SessionRequest GrowRequest() {
  v1::SessionRequest r;
  r.set_id(2);
  r.mutable_arena_grow()->set_size(kArenaBytes);
  return r;
}
v1::SessionRequest RingRequest(uint64_t size = ring::kRegionBytes,
                               uint32_t version = ring::kVersion) {
  v1::SessionRequest r;
  r.set_id(3);
  r.mutable_ring_setup()->set_size(size);
  r.mutable_ring_setup()->set_version(version);
  return r;
}

// A Session driven through Handle() (no socket); its ring thread runs.
struct Fixture {
  explicit Fixture(SessionLimits limits = Limits())
      : session(7, UniqueFd(), PeerCred{1, 2, 3}, limits, &backend, &counters) {
    v1::SessionResponse hello = session.Handle(HelloRequest(), {});
    REQUIRE(hello.status().code() == 0);
    std::vector<UniqueFd> fds;
    fds.push_back(UniqueFd(::dup(client.arena_fd.get())));
    REQUIRE(session.Handle(GrowRequest(), std::move(fds)).status().code() == 0);
  }
  v1::SessionResponse SetUp(uint64_t size = ring::kRegionBytes,
                            uint32_t version = ring::kVersion) {
    std::vector<UniqueFd> fds;
    fds.push_back(UniqueFd(::dup(client.ring_fd.get())));
    return session.Handle(RingRequest(size, version), std::move(fds));
  }
  Client client;
  Backend backend;
  SessionCounters counters;
  Session session;
};

TEST_CASE("Hello offers the launch ring", "[ring]") {
  Fixture fx;
  Backend b;
  SessionCounters c;
  Session s(1, UniqueFd(), PeerCred{}, Limits(), &b, &c);
  CHECK(s.Handle(HelloRequest(), {}).hello().launch_ring() == ring::kVersion);
  SessionLimits off = Limits();
  off.launch_ring = false;
  Session s2(2, UniqueFd(), PeerCred{}, off, &b, &c);
  CHECK(s2.Handle(HelloRequest(), {}).hello().launch_ring() == 0);
}

TEST_CASE("RingSetup refusals", "[ring]") {
  Fixture fx;
  CHECK(fx.SetUp(ring::kRegionBytes, 99).status().message() ==
        "launch ring version 99 is not supported; kregd serves version 2 "
        "(the client library and kregd are from different releases; "
        "launches go on the session socket: update the older one)");
  CHECK(fx.session.Handle(RingRequest(), {}).status().message() ==
        "RingSetup needs exactly one memfd attached, got 0");
  CHECK(fx.SetUp(4096).status().code() ==
        int(absl::StatusCode::kInvalidArgument));
  std::vector<UniqueFd> unsealed;
  unsealed.push_back(MakeMemfd(ring::kRegionBytes, /*seal=*/false));
  CHECK(fx.session.Handle(RingRequest(), std::move(unsealed))
            .status()
            .message() ==
        "launch ring fd must be a memfd sealed with F_SEAL_SHRINK");
  REQUIRE(fx.SetUp().status().code() == 0);
  CHECK(fx.SetUp().status().message() ==
        "this session's launch ring is already set up");
  SessionLimits off = Limits();
  off.launch_ring = false;
  Fixture no_ring(off);
  CHECK(no_ring.SetUp().status().code() ==
        int(absl::StatusCode::kFailedPrecondition));
}

TEST_CASE("Ring launches run in order and wrap around slots and 2^32",
          "[ring]") {
  Fixture fx;
  fx.client.StartAt(0xFFFFFFFAu);
  REQUIRE(fx.SetUp().status().code() == 0);
  for (int i = 0; i < 3 * int(ring::kSlots) + 5; ++i) {
    fx.client.floats(0)[0] = float(i);
    fx.client.Submit(Doubling(0, 64), 100 + i);
    int code = -1;
    std::string msg;
    uint64_t tag = 0;
    REQUIRE(fx.client.Await(&code, &msg, &tag));
    CHECK(code == 0);
    CHECK(tag == uint64_t(100 + i));
    CHECK(fx.client.floats(64)[0] == 2.0f * i);
  }
  CHECK(fx.client.tail < 0x10u);  // wrapped
  CHECK(fx.counters.launches == 3 * ring::kSlots + 5);
}

TEST_CASE("A full ring of submissions completes in order", "[ring]") {
  Fixture fx;
  REQUIRE(fx.SetUp().status().code() == 0);
  for (int round = 0; round < 3; ++round) {
    for (uint32_t i = 0; i < ring::kSlots; ++i) {
      fx.client.floats(256 * i)[0] = float(round * 10 + i);
      fx.client.Submit(Doubling(256 * i, 256 * i + 64), i);
    }
    for (uint32_t i = 0; i < ring::kSlots; ++i) {
      int code = -1;
      std::string msg;
      uint64_t tag = 99;
      REQUIRE(fx.client.Await(&code, &msg, &tag));
      CHECK(code == 0);
      CHECK(tag == i);
      CHECK(fx.client.floats(256 * i + 64)[0] == 2.0f * (round * 10 + i));
    }
  }
}

TEST_CASE("Ring errors are synchronous; long messages are cut with a marker",
          "[ring]") {
  Fixture fx;
  REQUIRE(fx.SetUp().status().code() == 0);
  int code;
  std::string msg;
  fx.client.Submit(Doubling(0, kArenaBytes), 1);  // ret past the arena
  REQUIRE(fx.client.Await(&code, &msg));
  CHECK(code == int(absl::StatusCode::kOutOfRange));
  CHECK(msg ==
        "ret 0: region [65536, 65552) ends past the session arena of "
        "65536 bytes");
  LaunchSpec overflow = Doubling(0, 64);
  overflow.mutable_args(0)->set_offset(~uint64_t{0} - 7);
  fx.client.Submit(overflow, 2);
  REQUIRE(fx.client.Await(&code, &msg));
  CHECK(code == int(absl::StatusCode::kOutOfRange));
  CHECK(msg.find("overflows") != std::string::npos);
  LaunchSpec other = Doubling(0, 64);
  other.set_target_name("u");
  fx.client.Submit(other, 3);
  REQUIRE(fx.client.Await(&code, &msg));
  CHECK(code == int(absl::StatusCode::kNotFound));
  CHECK(msg == "not registered: u");
  LaunchSpec fail = Doubling(0, 64);
  v1::Attribute* a = fail.add_attrs();
  a->set_name("fail");
  a->set_kind(v1::ATTR_KIND_STRING);
  fx.client.Submit(fail, 4);
  REQUIRE(fx.client.Await(&code, &msg));
  CHECK(code == int(absl::StatusCode::kInternal));
  CHECK(msg.size() == ring::kMaxMessageBytes);
  CHECK(msg.find(" [... message truncated: 10000 bytes in all]") !=
        std::string::npos);
  CHECK(fx.counters.launch_errors == 4);
  fx.client.Submit(Doubling(0, 64), 5);  // and it still serves
  REQUIRE(fx.client.Await(&code, &msg));
  CHECK(code == 0);
}

TEST_CASE("Garbage descriptors get error completions", "[ring]") {
  Fixture fx;
  REQUIRE(fx.SetUp().status().code() == 0);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) {
    char* slot = ring::SubmitSlot(fx.client.base, fx.client.tail);
    size_t n = rng() % ring::kSubmitSlotBytes;
    for (size_t j = 0; j < n; ++j) slot[j] = static_cast<char>(rng());
    if (i % 3 == 0) {  // a plausible length and seq
      uint32_t len = static_cast<uint32_t>(n);
      memcpy(slot, &len, 4);
      memcpy(slot + 4, &fx.client.tail, 4);
    }
    fx.client.Publish();
    int code = 0;
    std::string msg;
    REQUIRE(fx.client.Await(&code, &msg));
    CHECK(code != 0);
  }
  CHECK(fx.backend.executed == 0);
  int code;
  std::string msg;
  fx.client.Submit(Doubling(0, 64), 1);
  REQUIRE(fx.client.Await(&code, &msg));
  CHECK(code == 0);
}

TEST_CASE("A client rewriting descriptors while they are read", "[ring]") {
  Fixture fx;
  REQUIRE(fx.SetUp().status().code() == 0);
  std::atomic<bool> stop{false};
  std::thread scribbler([&] {
    std::mt19937_64 rng(3);
    while (!stop.load()) {
      char* slot = ring::SubmitSlot(fx.client.base, rng() % ring::kSlots);
      size_t at = rng() % 256;
      __atomic_store_n(slot + at, static_cast<char>(rng()), __ATOMIC_RELAXED);
    }
  });
  // Every launch completes: run, or refused as a bad descriptor (never
  // a crash, a hang or an internal error).
  std::map<int, int> codes;
  for (int i = 0; i < 3000; ++i) {
    fx.client.Submit(Doubling(0, 64), i);
    int code;
    std::string msg;
    REQUIRE(fx.client.Await(&code, &msg));
    ++codes[code];
    if (code != 0) {
      // Refused as the client's mistake (INVALID_ARGUMENT, NOT_FOUND,
      // OUT_OF_RANGE, ...), never as kregd's own failure, and said.
      INFO(code << ": " << msg);
      CHECK(code != static_cast<int>(absl::StatusCode::kInternal));
      CHECK(code != static_cast<int>(absl::StatusCode::kUnknown));
      CHECK_FALSE(msg.empty());
    }
  }
  stop = true;
  scribbler.join();
  INFO(codes[0] << " of 3000 launches survived the scribbler intact");
  // The ring still serves a clean launch afterwards.
  int code;
  std::string msg;
  fx.client.Submit(Doubling(0, 64), 4000);
  REQUIRE(fx.client.Await(&code, &msg));
  CHECK(code == 0);
  CHECK(msg == "");
}

// Runs `l` (published as written, after `rewrite` changed the slot) and
// returns the 4 outputs; the launch must succeed.
std::vector<float> RunScaling(Fixture* fx, const LaunchSpec& l,
                              const std::function<void(char*)>& rewrite = {}) {
  for (int i = 0; i < 4; ++i) fx->client.floats(0)[i] = float(i + 1);
  char* slot = ring::SubmitSlot(fx->client.base, fx->client.tail);
  REQUIRE(EncodeIntoSlot(l, fx->client.tail, 1, slot) > 0);
  if (rewrite) rewrite(slot);
  fx->client.Publish();
  int code = -1;
  std::string msg;
  REQUIRE(fx->client.Await(&code, &msg));
  INFO(msg);
  REQUIRE(code == 0);
  return std::vector<float>(fx->client.floats(64), fx->client.floats(64) + 4);
}

std::vector<float> Times(float f) { return {f, 2 * f, 3 * f, 4 * f}; }

// Where the descriptors of Scaling(2) and Scaling(3) differ: one byte.
size_t FactorByte() {
  const std::string a = EncodeSpec(Scaling(2), 0, 1);
  const std::string b = EncodeSpec(Scaling(3), 0, 1);
  const size_t n = a.size();
  REQUIRE(b.size() == n);
  size_t at = 0, differ = 0;
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) {
      at = i;
      ++differ;
    }
  }
  REQUIRE(differ == 1);
  return at;
}

TEST_CASE("Attribute blocks: alternating call sites through a real FfiHost",
          "[ring][attrs]") {
  FfiHost host(FfiHostOptions{1});
  Fixture fx;
  fx.backend.host = &host;
  REQUIRE(fx.SetUp().status().code() == 0);
  // A few call sites alternating, and a stream of new ones (more than the
  // executor keeps) in between.
  for (int i = 0; i < 300; ++i) {
    const float factors[] = {2.0f, 3.0f, 0.5f, -1.0f};
    float f = i % 5 == 4 ? float(i) : factors[i % 4];
    CHECK(RunScaling(&fx, Scaling(f, std::to_string(f))) == Times(f));
  }
}

TEST_CASE("Attribute blocks the client rewrites in the slot", "[ring][attrs]") {
  FfiHost host(FfiHostOptions{1});
  Fixture fx;
  fx.backend.host = &host;
  REQUIRE(fx.SetUp().status().code() == 0);
  const size_t at = FactorByte();
  CHECK(RunScaling(&fx, Scaling(2)) == Times(2));
  // The executor has the block of factor 2 cached; the client writes the
  // same descriptor, then rewrites the factor in place before publishing.
  for (int i = 0; i < 8; ++i) {
    CHECK(RunScaling(&fx, Scaling(2), [&](char* slot) { slot[at] = 0x40; }) ==
          Times(3));
    CHECK(RunScaling(&fx, Scaling(2)) == Times(2));
  }
}

TEST_CASE("Attribute blocks rewritten while the executor reads them",
          "[ring][attrs]") {
  FfiHost host(FfiHostOptions{1});
  Fixture fx;
  fx.backend.host = &host;
  REQUIRE(fx.SetUp().status().code() == 0);
  const size_t at = FactorByte();
  std::atomic<bool> stop{false};
  std::thread scribbler([&] {
    for (uint32_t n = 0; !stop.load(); ++n) {
      char* slot = ring::SubmitSlot(fx.client.base, n % ring::kSlots);
      __atomic_store_n(slot + at, static_cast<char>(n & 64), __ATOMIC_RELAXED);
    }
  });
  // Every launch runs with factor 2 or 3 (the one byte it copied), all of
  // its outputs alike; none fails, none sees stale attributes.
  int threes = 0;
  for (int i = 0; i < 2000; ++i) {
    std::vector<float> got = RunScaling(&fx, Scaling(2));
    if (got == Times(3)) {
      ++threes;
    } else {
      CHECK(got == Times(2));
    }
  }
  stop = true;
  scribbler.join();
  INFO(threes << " of 2000 launches saw the rewritten factor");
  CHECK(RunScaling(&fx, Scaling(2)) == Times(2));  // once it has stopped
}

// A Session served by Run() on a socket, the client side in this process
// (or a forked child).
struct Served {
  Served() {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    client_sock = UniqueFd(sv[0]);
    session = std::make_unique<Session>(9, UniqueFd(sv[1]), PeerCred{1, 2, 3},
                                        Limits(), &backend, &counters);
  }
  void Start() {
    thread = std::thread([this] {
      session->Run();
      ended = true;
    });
  }
  // Sends `r` with `fd` (or none) and reads the reply.
  v1::SessionResponse Call(const v1::SessionRequest& r, int fd = -1) {
    std::string out;
    r.SerializeToString(&out);
    REQUIRE(wire::SendFrame(client_sock.get(), out.data(), out.size(), &fd,
                            fd >= 0 ? 1 : 0) == wire::kOk);
    std::string in;
    std::vector<int> fds;
    REQUIRE(wire::RecvFrame(client_sock.get(), 1 << 20, &in, &fds) ==
            wire::kOk);
    v1::SessionResponse resp;
    REQUIRE(resp.ParseFromString(in));
    return resp;
  }
  void SetUpRing(Client* c) {
    REQUIRE(Call(HelloRequest()).status().code() == 0);
    REQUIRE(Call(GrowRequest(), c->arena_fd.get()).status().code() == 0);
    REQUIRE(Call(RingRequest(), c->ring_fd.get()).status().code() == 0);
  }
  // Run() returns within 10 s.
  bool AwaitEnd() {
    for (int i = 0; i < 1000 && !ended; ++i) ::usleep(10000);
    if (ended) thread.join();
    return ended;
  }
  Backend backend;
  SessionCounters counters;
  UniqueFd client_sock;
  std::unique_ptr<Session> session;
  std::thread thread;
  std::atomic<bool> ended{false};
};

TEST_CASE("Impossible ring indices end the session", "[ring]") {
  Served s;
  s.Start();
  Client c;
  s.SetUpRing(&c);
  c.Submit(Doubling(0, 64), 1);
  int code;
  std::string msg;
  REQUIRE(c.Await(&code, &msg));
  CHECK(code == 0);
  ring::Store(c.c()->sq_tail, c.tail + 1000);  // a ring's worth and more
  ring::FutexWake(&c.c()->sq_tail);
  REQUIRE(s.AwaitEnd());
  char byte;
  CHECK(::recv(s.client_sock.get(), &byte, 1, 0) == 0);  // EOF
  CHECK(ring::Load(c.c()->closed) == 1);
}

TEST_CASE("Consuming completions never given ends the session", "[ring]") {
  Served s;
  s.Start();
  Client c;
  s.SetUpRing(&c);
  ring::Store(c.c()->cq_head, 12345);
  c.Submit(Doubling(0, 64), 1);
  REQUIRE(s.AwaitEnd());
  CHECK(s.backend.executed == 0);
}

TEST_CASE("Closing the socket stops a ring thread asleep on the doorbell",
          "[ring]") {
  Served s;
  s.Start();
  Client c;
  s.SetUpRing(&c);
  ::usleep(50000);  // past the spin: asleep in FUTEX_WAIT
  CHECK(ring::Load(c.c()->sq_waiting) == 1);
  s.client_sock.reset();
  REQUIRE(s.AwaitEnd());
}

TEST_CASE("A client that dies mid-write neither hangs nor crashes the session",
          "[ring]") {
  for (int variant = 0; variant < 3; ++variant) {
    INFO("variant " << variant);
    Served s;
    Client c;
    s.Start();
    s.SetUpRing(&c);
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // Half a descriptor, then: 0 die unpublished; 1 publish it torn and
      // die; 2 die while the executor waits for a second, unpublished one.
      LaunchSpec l = Doubling(0, 64);
      const std::string bytes = EncodeSpec(l, c.tail, 1);
      const char* full = bytes.data();
      const size_t n = bytes.size();
      char* slot = ring::SubmitSlot(c.base, c.tail);
      memcpy(slot, full, n / 2);
      if (variant == 1) c.Publish();
      if (variant == 2) {
        memcpy(slot, full, n);
        c.Publish();
        ring::SpinPolicy sleep_at_once(0);
        ring::SpinThenWait(&c.c()->cq_tail, c.head, &c.c()->cq_waiting,
                           &sleep_at_once, 1'000'000'000);
        memcpy(ring::SubmitSlot(c.base, c.tail), full, n / 3);
      }
      ::_exit(0);
    }
    s.client_sock.reset();  // the child holds the only client end now
    int ws = 0;
    REQUIRE(::waitpid(pid, &ws, 0) == pid);
    CHECK(WIFEXITED(ws));
    REQUIRE(s.AwaitEnd());
    CHECK(s.backend.executed == (variant == 2 ? 1 : 0));
  }
}

}  // namespace
}  // namespace kreg
