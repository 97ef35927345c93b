#include "daemon/executor/session.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "catch2/catch.hpp"
#include "common/wire.h"
#include "daemon/executor/repoint_table.h"
#include "tests/daemon/executor/test_util.h"
#include "tests/testing/launch_spec.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace {

using ::kreg::testing::MakeMemfd;

constexpr char kNotInSession[] =
    "register_target, list and control_hello are not served in a session: "
    "send them on a control connection (a connection to the session socket "
    "whose first request is not hello), which kregd serves itself";

v1::SessionRequest ListRequest() {
  v1::SessionRequest r;
  r.mutable_list();
  return r;
}

// Doubles F32 arg 0 into ret 0 for target "t"; everything else NOT_FOUND.
class FakeBackend : public SessionBackend {
 public:
  // "local.ok": a module fd; "local.nofd": success without one; other
  // names: the backend's refusal.
  absl::StatusOr<v1::BindLocalReply> BindLocal(const v1::BindLocal& r,
                                               UniqueFd* module) override {
    if (r.target_name() == "local.ok") {
      *module = MakeMemfd(64);
      v1::BindLocalReply reply;
      reply.mutable_target()->set_target_name("local.ok");
      reply.mutable_target()->set_module_size(64);
      return reply;
    }
    if (r.target_name() == "local.nofd") return v1::BindLocalReply();
    return absl::PermissionDeniedError("local_execution = \"deny\"");
  }
  absl::StatusOr<ResolvedHandler> Lookup(const TargetKey& key,
                                         uint32_t) override {
    ++lookups;
    if (key.name != "t")
      return absl::NotFoundError("not registered: " + key.name);
    return ResolvedHandler{reinterpret_cast<void*>(0x1)};
  }
  absl::Status Execute(void*, const LaunchFrame& frame) override {
    if (!frame.attrs.empty()) return absl::InternalError("handler says no");
    auto* in = static_cast<float*>(frame.args[0].data);
    auto* out = static_cast<float*>(frame.rets[0].data);
    for (int64_t i = 0; i < frame.args[0].dims[0]; ++i) out[i] = 2 * in[i];
    return absl::OkStatus();
  }
  uint32_t ffi_api_major() const override { return 0; }
  uint32_t ffi_api_minor() const override { return 4; }
  int lookups = 0;
};

struct Fixture {
  Fixture()
      : session(7, UniqueFd(), PeerCred{1, 2, 3}, Limits(), &backend,
                &counters) {}
  static SessionLimits Limits() {
    SessionLimits l;
    l.max_arena_bytes = 1 << 20;
    l.max_module_bytes = 1 << 20;
    return l;
  }
  v1::SessionResponse Send(const v1::SessionRequest& r,
                           std::vector<UniqueFd> fds = {}) {
    return session.Handle(r, std::move(fds));
  }
  v1::SessionResponse Hello(uint32_t minor = kSessionProtocolMinor) {
    v1::SessionRequest r;
    r.set_id(1);
    r.mutable_hello()->set_protocol_major(kSessionProtocolMajor);
    r.mutable_hello()->set_protocol_minor(minor);
    return Send(r);
  }
  FakeBackend backend;
  SessionCounters counters;
  Session session;
};

testing::LaunchSpec Spec(const std::string& target) {
  testing::LaunchSpec l;
  l.set_target_name(target);
  l.set_platform("cpu");
  for (auto* b : {l.add_args(), l.add_rets()}) {
    b->set_dtype(XLA_FFI_DataType_F32);
    b->add_dims(2);
    b->set_size(8);
  }
  l.mutable_rets(0)->set_offset(64);
  return l;
}

v1::SessionRequest LaunchRequest(const std::string& target) {
  return testing::LaunchRequest(Spec(target), 5);
}

// Gives `session` a 4096-byte arena; returns its memory, mapped here.
float* GrowArena(Session& session) {
  UniqueFd fd = MakeMemfd(4096);
  auto* mem = static_cast<float*>(
      ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0));
  v1::SessionRequest grow;
  grow.mutable_arena_grow()->set_size(4096);
  std::vector<UniqueFd> fds;
  fds.push_back(std::move(fd));
  REQUIRE(session.Handle(grow, std::move(fds)).arena_grow().size() == 4096);
  return mem;
}

// Says Hello on `session`, then GrowArena.
float* HelloWithArena(Session& session) {
  v1::SessionRequest hello;
  hello.mutable_hello()->set_protocol_major(kSessionProtocolMajor);
  hello.mutable_hello()->set_protocol_minor(kSessionProtocolMinor);
  REQUIRE(session.Handle(hello, {}).status().code() == 0);
  return GrowArena(session);
}

TEST_CASE("Hello answers with the session's id and limits", "[session]") {
  Fixture fx;
  v1::SessionResponse resp = fx.Hello();
  CHECK(resp.id() == 1);
  CHECK(resp.status().code() == 0);
  CHECK(resp.hello().session_id() == 7);
  CHECK(resp.hello().ffi_api_minor() == 4);
  CHECK(resp.hello().max_arena_bytes() == 1 << 20);
}

TEST_CASE("Requests before Hello are refused", "[session]") {
  Fixture fx;
  v1::SessionRequest r;
  r.mutable_list();
  v1::SessionResponse resp = fx.Send(r);
  CHECK(resp.status().code() == int(absl::StatusCode::kFailedPrecondition));
  CHECK(resp.status().message() ==
        "the first request of a session must be Hello");
}

v1::SessionRequest BindLocalRequest(const std::string& target) {
  v1::SessionRequest r;
  r.set_id(9);
  r.mutable_bind_local()->set_target_name(target);
  r.mutable_bind_local()->set_platform("cpu");
  return r;
}

TEST_CASE("BindLocal answers with the entry and attaches the module fd",
          "[session][local]") {
  Fixture fx;
  fx.Hello();
  v1::SessionResponse resp = fx.Send(BindLocalRequest("local.ok"));
  CHECK(resp.status().code() == 0);
  CHECK(resp.bind_local().target().target_name() == "local.ok");
  UniqueFd fd = fx.session.TakeReplyFd();
  REQUIRE(fd.ok());
  CHECK(::lseek(fd.get(), 0, SEEK_END) == 64);
  // Taken once: the next response carries none.
  CHECK_FALSE(fx.session.TakeReplyFd().ok());
  fx.Send(BindLocalRequest("local.ok"));
  v1::SessionRequest list;
  list.mutable_list();
  fx.Send(list);  // a later request drops a fd nobody took
  CHECK_FALSE(fx.session.TakeReplyFd().ok());
}

TEST_CASE("BindLocal errors come back and attach nothing", "[session][local]") {
  Fixture fx;
  v1::SessionResponse before = fx.Send(BindLocalRequest("local.ok"));
  CHECK(before.status().message() ==
        "the first request of a session must be Hello");
  CHECK_FALSE(fx.session.TakeReplyFd().ok());
  fx.Hello();
  v1::SessionResponse denied = fx.Send(BindLocalRequest("local.denied"));
  CHECK(denied.status().code() == int(absl::StatusCode::kPermissionDenied));
  CHECK(denied.status().message() == "local_execution = \"deny\"");
  CHECK_FALSE(denied.has_bind_local());
  CHECK_FALSE(fx.session.TakeReplyFd().ok());
  v1::SessionResponse nofd = fx.Send(BindLocalRequest("local.nofd"));
  CHECK(nofd.status().code() == int(absl::StatusCode::kInternal));
  CHECK(nofd.status().message() ==
        "kregd answered BindLocal without the module's memfd");
  // A client may not attach descriptors to it.
  std::vector<UniqueFd> fds;
  fds.push_back(MakeMemfd(8));
  v1::SessionResponse with_fd =
      fx.Send(BindLocalRequest("local.ok"), std::move(fds));
  CHECK(with_fd.status().code() == int(absl::StatusCode::kInvalidArgument));
  CHECK_THAT(with_fd.status().message(),
             Catch::Contains("1 unexpected file descriptor(s)"));
  CHECK_FALSE(fx.session.TakeReplyFd().ok());
}

TEST_CASE("A backend without local execution says so", "[session][local]") {
  class Plain : public FakeBackend {
   public:
    absl::StatusOr<v1::BindLocalReply> BindLocal(const v1::BindLocal& r,
                                                 UniqueFd* m) override {
      return SessionBackend::BindLocal(r, m);
    }
  } backend;
  SessionCounters counters;
  Session session(8, UniqueFd(), PeerCred{1, 2, 3}, Fixture::Limits(), &backend,
                  &counters);
  v1::SessionRequest hello;
  hello.mutable_hello()->set_protocol_major(kSessionProtocolMajor);
  session.Handle(hello, {});
  v1::SessionResponse resp = session.Handle(BindLocalRequest("x"), {});
  CHECK(resp.status().code() == int(absl::StatusCode::kUnimplemented));
  CHECK(resp.status().message() ==
        "this session backend cannot hand out modules for local execution");
}

TEST_CASE("A second Hello is refused", "[session]") {
  Fixture fx;
  fx.Hello();
  CHECK(fx.Hello().status().message() == "Hello was already sent");
}

TEST_CASE("A client of another major is refused at Hello, saying who is older",
          "[session]") {
  Fixture fx;
  v1::SessionRequest r;
  r.mutable_hello()->set_protocol_major(1);
  r.mutable_hello()->set_protocol_minor(8);
  v1::SessionResponse resp = fx.Send(r);
  CHECK(resp.status().code() == int(absl::StatusCode::kFailedPrecondition));
  CHECK(resp.status().message() ==
        "the client library speaks session protocol 1.8 and kregd 2.0: the "
        "client library is older. Update the client library (the kreg "
        "wheel) so that both are from the same release");
  // Still before Hello: nothing else is served.
  resp = fx.Send(LaunchRequest("t"));
  CHECK(resp.status().message() ==
        "the first request of a session must be Hello");
  r.mutable_hello()->set_protocol_major(3);
  r.mutable_hello()->set_protocol_minor(1);
  CHECK(fx.Send(r).status().message() ==
        "the client library speaks session protocol 3.1 and kregd 2.0: kregd "
        "is older. Update kregd so that both are from the same release");
}

TEST_CASE("A client of a later minor is served; kregd says its own",
          "[session]") {
  Fixture fx;
  v1::SessionResponse resp = fx.Hello(kSessionProtocolMinor + 3);
  REQUIRE(resp.status().code() == 0);
  CHECK(resp.hello().protocol_major() == kSessionProtocolMajor);
  CHECK(resp.hello().protocol_minor() == kSessionProtocolMinor);
}

TEST_CASE("An empty request is refused", "[session]") {
  Fixture fx;
  fx.Hello();
  v1::SessionResponse resp = fx.Send(v1::SessionRequest());
  CHECK(resp.status().message() == "unknown session request kind 0");
}

TEST_CASE("Descriptors on a request other than ArenaGrow are refused",
          "[session]") {
  Fixture fx;
  fx.Hello();
  std::vector<UniqueFd> fds;
  fds.push_back(MakeMemfd(4096));
  v1::SessionResponse resp = fx.Send(LaunchRequest("t"), std::move(fds));
  CHECK(resp.status().code() == int(absl::StatusCode::kInvalidArgument));
  CHECK(resp.status().message() ==
        "1 file descriptor(s) attached to a CPU launch");
}

TEST_CASE("ArenaGrow needs exactly one descriptor", "[session]") {
  Fixture fx;
  fx.Hello();
  v1::SessionRequest r;
  r.mutable_arena_grow()->set_size(4096);
  CHECK(fx.Send(r).status().message() ==
        "ArenaGrow needs exactly one memfd attached, got 0");
  std::vector<UniqueFd> two;
  two.push_back(MakeMemfd(4096));
  two.push_back(MakeMemfd(4096));
  CHECK(fx.Send(r, std::move(two)).status().message() ==
        "ArenaGrow needs exactly one memfd attached, got 2");
}

TEST_CASE("ArenaGrow passes the arena's refusal through", "[session]") {
  Fixture fx;
  fx.Hello();
  v1::SessionRequest r;
  r.mutable_arena_grow()->set_size(2 << 20);
  std::vector<UniqueFd> fds;
  fds.push_back(MakeMemfd(2 << 20));
  v1::SessionResponse resp = fx.Send(r, std::move(fds));
  CHECK(resp.status().code() == int(absl::StatusCode::kResourceExhausted));
}

TEST_CASE("Launch runs the handler on arena memory", "[session]") {
  Fixture fx;
  fx.Hello();
  float* mem = GrowArena(fx.session);
  mem[0] = 1.5f;
  mem[1] = -2.0f;
  v1::SessionResponse resp = fx.Send(LaunchRequest("t"));
  CHECK(resp.status().code() == 0);
  CHECK(resp.has_launch());
  CHECK(mem[16] == 3.0f);
  CHECK(mem[17] == -4.0f);
  fx.Send(LaunchRequest("t"));
  CHECK(fx.backend.lookups == 1);  // cached per session
  CHECK(fx.counters.launches == 2);
  CHECK(fx.counters.launch_errors == 0);
  ::munmap(mem, 4096);
}

TEST_CASE("Launch: validation, lookup and handler errors come back",
          "[session]") {
  Fixture fx;
  fx.Hello();
  // No arena yet: the buffers are out of range.
  v1::SessionResponse resp = fx.Send(LaunchRequest("t"));
  CHECK(resp.status().code() == int(absl::StatusCode::kOutOfRange));
  CHECK(resp.status().message() ==
        "arg 0: region [0, 8) ends past the session arena of 0 bytes");
  v1::SessionRequest grow;
  grow.mutable_arena_grow()->set_size(4096);
  std::vector<UniqueFd> fds;
  fds.push_back(MakeMemfd(4096));
  fx.Send(grow, std::move(fds));
  resp = fx.Send(LaunchRequest("missing"));
  CHECK(resp.status().code() == int(absl::StatusCode::kNotFound));
  CHECK(resp.status().message() == "not registered: missing");
  testing::LaunchSpec bad = Spec("t");
  v1::Attribute* a = bad.add_attrs();
  a->set_name("x");
  a->set_kind(v1::ATTR_KIND_STRING);
  resp = fx.Send(testing::LaunchRequest(bad, 5));
  CHECK(resp.status().code() == int(absl::StatusCode::kInternal));
  CHECK(resp.status().message() == "handler says no");
  // A Launch whose descriptor is not one.
  v1::SessionRequest empty;
  empty.mutable_launch()->set_descriptor("short");
  resp = fx.Send(empty);
  CHECK(resp.status().code() == int(absl::StatusCode::kInvalidArgument));
  CHECK(resp.status().message() ==
        "launch descriptor of 5 bytes is shorter than its 88-byte header");
  CHECK(fx.counters.launches == 4);
  CHECK(fx.counters.launch_errors == 4);
}

TEST_CASE(
    "A re-pointed target switches at the next launch, counted in its new "
    "generation's stats row; the launch in flight finishes on its old handler",
    "[session][repoint]") {
  // The handler "pointer" is the factor: 2 for generation 1, 3 for 2; their
  // tokens are 11 and 12.
  class Repointed : public FakeBackend {
   public:
    absl::StatusOr<ResolvedHandler> Lookup(const TargetKey&,
                                           uint32_t) override {
      ++lookups;
      return ResolvedHandler{reinterpret_cast<void*>(2), 11};
    }
    void BeginLaunch(uint64_t, const TargetKey&, uint32_t token) override {
      tokens.push_back(token);
    }
    absl::Status Execute(void* handler, const LaunchFrame& frame) override {
      if (hold_next.exchange(false)) {
        entered.Notify();
        release.WaitForNotification();
      }
      const float factor = reinterpret_cast<uintptr_t>(handler);
      auto* in = static_cast<float*>(frame.args[0].data);
      auto* out = static_cast<float*>(frame.rets[0].data);
      for (int64_t i = 0; i < frame.args[0].dims[0]; ++i) {
        out[i] = factor * in[i];
      }
      return absl::OkStatus();
    }
    const RepointTable* Repoints() const override { return &table; }
    RepointTable table;
    std::atomic<bool> hold_next{false};
    absl::Notification entered, release;
    std::vector<uint32_t> tokens;
  } backend;
  SessionCounters counters;
  Session session(9, UniqueFd(), PeerCred{1, 2, 3}, Fixture::Limits(), &backend,
                  &counters);
  float* mem = HelloWithArena(session);
  mem[0] = 1.0f;
  mem[1] = 2.0f;
  REQUIRE(session.Handle(LaunchRequest("t"), {}).status().code() == 0);
  CHECK(mem[16] == 2.0f);

  backend.hold_next = true;
  std::thread in_flight([&] {
    CHECK(session.Handle(LaunchRequest("t"), {}).status().code() == 0);
  });
  backend.entered.WaitForNotification();
  REQUIRE(backend.table.Set({"t", Platform::kCpu}, 2,
                            reinterpret_cast<void*>(3), 12));
  backend.release.Notify();
  in_flight.join();
  CHECK(mem[16] == 2.0f);  // generation 1: it had its handler already
  CHECK(mem[17] == 4.0f);
  REQUIRE(session.Handle(LaunchRequest("t"), {}).status().code() == 0);
  CHECK(mem[16] == 3.0f);  // generation 2, without asking kregd again
  CHECK(mem[17] == 6.0f);
  CHECK(backend.lookups == 1);
  CHECK(backend.tokens == std::vector<uint32_t>{11, 11, 12});
  ::munmap(mem, 4096);
}

TEST_CASE(
    "A pinned target does not switch when its key is re-pointed; an unpinned "
    "launch of the same key does",
    "[session][repoint]") {
  // The handler "pointer" is the factor: the generation asked for plus 1
  // (2 for the current one, generation 1; 3 for a pin of generation 2), and
  // the token 10 + the generation.
  class Pinned : public FakeBackend {
   public:
    absl::StatusOr<ResolvedHandler> Lookup(const TargetKey&,
                                           uint32_t generation) override {
      asked.push_back(generation);
      const uint32_t g = generation == 0 ? 1 : generation;
      return ResolvedHandler{reinterpret_cast<void*>(g + 1), 10 + g};
    }
    void BeginLaunch(uint64_t, const TargetKey&, uint32_t token) override {
      tokens.push_back(token);
    }
    absl::Status Execute(void* handler, const LaunchFrame& frame) override {
      const float factor = reinterpret_cast<uintptr_t>(handler);
      auto* in = static_cast<float*>(frame.args[0].data);
      auto* out = static_cast<float*>(frame.rets[0].data);
      out[0] = factor * in[0];
      return absl::OkStatus();
    }
    const RepointTable* Repoints() const override { return &table; }
    RepointTable table;
    std::vector<uint32_t> asked;
    std::vector<uint32_t> tokens;
  } backend;
  SessionCounters counters;
  Session session(9, UniqueFd(), PeerCred{1, 2, 3}, Fixture::Limits(), &backend,
                  &counters);
  float* mem = HelloWithArena(session);
  mem[0] = 1.0f;
  testing::LaunchSpec pinned = Spec("t");
  pinned.set_generation(2);
  auto run = [&](const testing::LaunchSpec& l) {
    REQUIRE(session.Handle(testing::LaunchRequest(l, 5), {}).status().code() ==
            0);
    return mem[16];
  };
  CHECK(run(pinned) == 3.0f);
  CHECK(run(Spec("t")) == 2.0f);
  REQUIRE(backend.table.Set({"t", Platform::kCpu}, 3,
                            reinterpret_cast<void*>(4), 13));
  CHECK(run(pinned) == 3.0f);     // still generation 2
  CHECK(run(Spec("t")) == 4.0f);  // the current one switched to generation 3
  CHECK(run(pinned) == 3.0f);
  // Each asked kregd once: the pin for its generation, the other for the
  // current one.
  CHECK(backend.asked == std::vector<uint32_t>{2, 0});
  // Each launch counted in its generation's row.
  CHECK(backend.tokens == std::vector<uint32_t>{12, 11, 12, 13, 12});
  ::munmap(mem, 4096);
}

TEST_CASE(
    "A target held for its content switches only with a re-point that names "
    "its session",
    "[session][repoint][trust]") {
  // The handler "pointer" is the factor (2: generation 1); kregd says the
  // client's process registered the target (ResolveReply.holds_content).
  class Content : public FakeBackend {
   public:
    absl::StatusOr<ResolvedHandler> Lookup(const TargetKey&,
                                           uint32_t) override {
      return ResolvedHandler{reinterpret_cast<void*>(2), 11, true};
    }
    absl::Status Execute(void* handler, const LaunchFrame& frame) override {
      const float factor = reinterpret_cast<uintptr_t>(handler);
      static_cast<float*>(frame.rets[0].data)[0] =
          factor * static_cast<float*>(frame.args[0].data)[0];
      return absl::OkStatus();
    }
    const RepointTable* Repoints() const override { return &table; }
    RepointTable table;
  } backend;
  SessionCounters counters;
  Session session(9, UniqueFd(), PeerCred{1, 2, 3}, Fixture::Limits(), &backend,
                  &counters);
  float* mem = HelloWithArena(session);
  mem[0] = 1.0f;
  auto run = [&] {
    REQUIRE(session.Handle(testing::LaunchRequest(Spec("t"), 5), {})
                .status()
                .code() == 0);
    return mem[16];
  };
  CHECK(run() == 2.0f);
  // Another uid's generation: kregd names other sessions only.
  REQUIRE(backend.table.Set({"t", Platform::kCpu}, 2,
                            reinterpret_cast<void*>(3), 12, {4, 10}));
  CHECK(run() == 2.0f);
  // Its own uid's (or root's) generation names it.
  REQUIRE(backend.table.Set({"t", Platform::kCpu}, 3,
                            reinterpret_cast<void*>(4), 13, {10, 9}));
  CHECK(run() == 4.0f);
  // Still held for its content after the switch.
  REQUIRE(backend.table.Set({"t", Platform::kCpu}, 4,
                            reinterpret_cast<void*>(5), 14));
  CHECK(run() == 4.0f);
  ::munmap(mem, 4096);
}

TEST_CASE("Launch refuses CUDA targets (host arena buffers)", "[session]") {
  Fixture fx;
  fx.Hello();
  testing::LaunchSpec l = Spec("t");
  l.clear_args();
  l.clear_rets();
  l.set_platform("gpu");
  v1::SessionResponse resp = fx.Send(testing::LaunchRequest(l, 5));
  CHECK(resp.status().code() == int(absl::StatusCode::kUnimplemented));
  CHECK(resp.status().message() ==
        "launching \"t\" for platform cuda: this kregd serves no CUDA device "
        "(started without CUDA)");
  CHECK(fx.backend.lookups == 0);
}

TEST_CASE("RegisterTarget, List and control_hello are refused in a session",
          "[session]") {
  Fixture fx;
  fx.Hello();
  v1::SessionRequest r;
  r.mutable_register_target()->set_target_name("t");
  v1::SessionRequest hello;
  hello.mutable_control_hello()->set_protocol_major(2);
  for (v1::SessionResponse resp :
       {fx.Send(r), fx.Send(ListRequest()), fx.Send(hello)}) {
    CHECK(resp.status().code() == int(absl::StatusCode::kFailedPrecondition));
    CHECK(resp.status().message() == kNotInSession);
  }
}

// ---- the request loop over a socket --------------------------------------

struct Wired {
  Wired() {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    client.reset(sv[0]);
    SessionLimits limits;
    limits.max_message_bytes = 1024;
    session = std::make_unique<Session>(1, UniqueFd(sv[1]), PeerCred{}, limits,
                                        &backend, &counters);
    thread = std::thread([this] { session->Run(); });
  }
  ~Wired() {
    session->Shutdown();
    thread.join();
  }
  v1::SessionResponse Recv() {
    std::string payload;
    std::vector<int> fds;
    REQUIRE(wire::RecvFrame(client.get(), 1 << 20, &payload, &fds) ==
            wire::kOk);
    v1::SessionResponse resp;
    REQUIRE(resp.ParseFromString(payload));
    return resp;
  }
  FakeBackend backend;
  SessionCounters counters;
  UniqueFd client;
  std::unique_ptr<Session> session;
  std::thread thread;
};

TEST_CASE("Run answers requests in order", "[session]") {
  Wired w;
  v1::SessionRequest r;
  r.set_id(42);
  r.mutable_hello()->set_protocol_major(kSessionProtocolMajor);
  std::string out = r.SerializeAsString();
  REQUIRE(wire::SendFrame(w.client.get(), out.data(), out.size(), nullptr, 0) ==
          wire::kOk);
  CHECK(w.Recv().id() == 42);
}

TEST_CASE("Run answers a malformed request and keeps going", "[session]") {
  Wired w;
  std::string junk = "\xff\xff\xff";
  REQUIRE(wire::SendFrame(w.client.get(), junk.data(), junk.size(), nullptr,
                          0) == wire::kOk);
  v1::SessionResponse resp = w.Recv();
  CHECK(resp.status().code() == int(absl::StatusCode::kInvalidArgument));
  CHECK(resp.status().message() ==
        "malformed session request (3 bytes do not parse as "
        "kreg.v1.SessionRequest)");
}

TEST_CASE("Run refuses an oversized message and closes", "[session]") {
  Wired w;
  std::string big(2000, 'x');
  REQUIRE(wire::SendFrame(w.client.get(), big.data(), big.size(), nullptr, 0) ==
          wire::kOk);
  v1::SessionResponse resp = w.Recv();
  CHECK(resp.status().code() == int(absl::StatusCode::kResourceExhausted));
  CHECK(resp.status().message() ==
        "session message refused: message larger than the limit "
        "(max_message_bytes 1024, at most 32 fds)");
  std::string payload;
  std::vector<int> fds;
  CHECK(wire::RecvFrame(w.client.get(), 1 << 20, &payload, &fds) == wire::kEof);
}

TEST_CASE(
    "Half a first frame is cut off at the Hello deadline with "
    "DeadlineExceeded",
    "[session]") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  UniqueFd client(sv[0]);
  FakeBackend backend;
  SessionCounters counters;
  SessionLimits limits;
  limits.hello_timeout_ms = 300;
  Session session(1, UniqueFd(sv[1]), PeerCred{}, limits, &backend, &counters);
  const auto start = std::chrono::steady_clock::now();
  std::thread run([&] { session.Run(); });
  // A length of 100 and 10 of its bytes, then nothing.
  const char partial[14] = {100, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  REQUIRE(::send(client.get(), partial, sizeof(partial), MSG_NOSIGNAL) == 14);
  std::string payload;
  std::vector<int> fds;
  REQUIRE(wire::RecvFrame(client.get(), 1 << 20, &payload, &fds) == wire::kOk);
  v1::SessionResponse resp;
  REQUIRE(resp.ParseFromString(payload));
  CHECK(resp.id() == 0);
  CHECK(resp.status().code() == int(absl::StatusCode::kDeadlineExceeded));
  CHECK(resp.status().message() ==
        "kregd closed this session: no Hello within 300 ms of connecting");
  CHECK(wire::RecvFrame(client.get(), 1 << 20, &payload, &fds) == wire::kEof);
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took >= std::chrono::milliseconds(250));
  CHECK(took < std::chrono::seconds(3));
  run.join();
}

TEST_CASE("A complete Hello before the deadline keeps the session open",
          "[session]") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  UniqueFd client(sv[0]);
  FakeBackend backend;
  SessionCounters counters;
  SessionLimits limits;
  limits.hello_timeout_ms = 200;
  Session session(1, UniqueFd(sv[1]), PeerCred{}, limits, &backend, &counters);
  std::thread run([&] { session.Run(); });
  v1::SessionRequest r;
  r.set_id(5);
  r.mutable_hello()->set_protocol_major(kSessionProtocolMajor);
  std::string out = r.SerializeAsString();
  // Sent in two parts, the second well before the deadline.
  uint32_t len = static_cast<uint32_t>(out.size());
  REQUIRE(::send(client.get(), &len, 4, MSG_NOSIGNAL) == 4);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(::send(client.get(), out.data(), out.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(out.size()));
  std::string payload;
  std::vector<int> fds;
  REQUIRE(wire::RecvFrame(client.get(), 1 << 20, &payload, &fds) == wire::kOk);
  v1::SessionResponse resp;
  REQUIRE(resp.ParseFromString(payload));
  CHECK(resp.id() == 5);
  CHECK(resp.has_hello());
  // Well past the deadline, the session still answers.
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  v1::SessionRequest list = ListRequest();
  list.set_id(6);
  out = list.SerializeAsString();
  REQUIRE(wire::SendFrame(client.get(), out.data(), out.size(), nullptr, 0) ==
          wire::kOk);
  REQUIRE(wire::RecvFrame(client.get(), 1 << 20, &payload, &fds) == wire::kOk);
  REQUIRE(resp.ParseFromString(payload));
  CHECK(resp.id() == 6);
  CHECK(resp.status().message() == kNotInSession);
  session.Shutdown();
  run.join();
}

TEST_CASE("PeerCredOf reports this process", "[session]") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  auto peer = PeerCredOf(sv[0]);
  REQUIRE(peer.ok());
  CHECK(peer->pid == ::getpid());
  CHECK(peer->uid == ::getuid());
  ::close(sv[0]);
  ::close(sv[1]);
  CHECK(PeerCredOf(-1).status().code() == absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace kreg
