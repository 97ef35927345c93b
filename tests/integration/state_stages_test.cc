// A handler bundle's prepare and initialize stages in isolated mode
// (docs/kernel-author-guide.md, "Handler bundles and state"), against the
// real kregd and executor with libcounter_state.so, spoken over the raw
// session protocol as the shim's forwarding handler speaks it: XLA:CPU
// never runs these stages (XLA:GPU does: tests/gpu/test_state_bundles_cuda.py
// compares them with in-process), so this is where their CPU path is seen.
// A StageCall runs the real stage with the call site's real state; what
// kregd cannot carry (per-execution states) is refused by name; a crash in
// a stage is contained like one in execute.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "catch2/catch.hpp"
#include "common/session_protocol.h"
#include "common/wire.h"
#include "kreg/v1/session.pb.h"
#include "tests/testing/daemon_fixture.h"
#include "tests/testing/launch_spec.h"
#include "tests/testing/temp_dir.h"

namespace kreg {
namespace {

using testing::Daemon;
using testing::TempDir;

constexpr int32_t kF32 = 11;  // XLA_FFI_DataType
constexpr int32_t kS64 = 5;
constexpr uint64_t kArenaBytes = 1 << 20;
constexpr uint64_t kYOffset = 64;
constexpr uint64_t kNOffset = 128;
constexpr uint32_t kPrepare = 1;  // XLA_FFI_ExecutionStage
constexpr uint32_t kInitialize = 2;
constexpr int kCanceled = static_cast<int>(absl::StatusCode::kCancelled);
const char kStateType[] = "kreg.CounterState";

int Connect(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  return fd;
}

// The response to `r` (CANCELLED "eof"/"timeout" when none came).
v1::SessionResponse Call(int sock, const v1::SessionRequest& r, int fd = -1) {
  std::string out;
  r.SerializeToString(&out);
  REQUIRE(wire::SendFrame(sock, out.data(), out.size(), &fd, fd >= 0 ? 1 : 0) ==
          wire::kOk);
  v1::SessionResponse resp;
  pollfd p{sock, POLLIN, 0};
  if (::poll(&p, 1, 60000) != 1) {
    resp.mutable_status()->set_code(kCanceled);
    resp.mutable_status()->set_message("timeout");
    return resp;
  }
  std::string payload;
  std::vector<int> fds;
  int rc = wire::RecvFrame(sock, 1 << 20, &payload, &fds);
  for (int f : fds) ::close(f);
  if (rc != wire::kOk || !resp.ParseFromString(payload)) {
    resp.mutable_status()->set_code(kCanceled);
    resp.mutable_status()->set_message(rc == wire::kEof ? "eof" : "bad frame");
  }
  return resp;
}

// A session with a 1 MiB arena mapped here.
struct Session {
  int sock = -1;
  char* arena = nullptr;
  uint64_t next_id = 1;

  explicit Session(const Daemon& d) {
    sock = Connect(d.socket() + ".session");
    v1::SessionRequest hello;
    hello.set_id(next_id++);
    hello.mutable_hello()->set_protocol_major(kSessionProtocolMajor);
    hello.mutable_hello()->set_protocol_minor(kSessionProtocolMinor);
    v1::SessionResponse resp = Call(sock, hello);
    INFO(resp.status().message());
    REQUIRE(resp.has_hello());
    int memfd = ::memfd_create("kreg-arena", MFD_ALLOW_SEALING | MFD_CLOEXEC);
    REQUIRE(::ftruncate(memfd, kArenaBytes) == 0);
    REQUIRE(::fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0);
    void* p = ::mmap(nullptr, kArenaBytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                     memfd, 0);
    REQUIRE(p != MAP_FAILED);
    arena = static_cast<char*>(p);
    v1::SessionRequest grow;
    grow.set_id(next_id++);
    grow.mutable_arena_grow()->set_size(kArenaBytes);
    resp = Call(sock, grow, memfd);
    ::close(memfd);
    INFO(resp.status().message());
    REQUIRE(resp.status().code() == 0);
  }
  ~Session() {
    ::munmap(arena, kArenaBytes);
    ::close(sock);
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  v1::SessionResponse Send(v1::SessionRequest r) {
    r.set_id(next_id++);
    return Call(sock, r);
  }
};

// A call of `target` with the counter bundle's attributes (offset 0.5,
// buffer_elems 3) and, unless `attrs_only`, x f32[4] at 0, y f32[4] at
// kYOffset and n s64[] at kNOffset; `shapes_only`: every offset 0 (a
// StageCall's buffers).
testing::LaunchSpec Spec(const std::string& target, uint64_t state,
                         bool attrs_only, bool shapes_only = false) {
  testing::LaunchSpec l;
  l.set_target_name(target);
  l.set_platform("cpu");
  l.set_state(state);
  v1::Attribute* elems = l.add_attrs();
  elems->set_name("buffer_elems");
  elems->set_kind(v1::ATTR_KIND_SCALAR);
  elems->set_dtype(kS64);
  const int64_t three = 3;
  elems->set_data(std::string(reinterpret_cast<const char*>(&three), 8));
  v1::Attribute* offset = l.add_attrs();
  offset->set_name("offset");
  offset->set_kind(v1::ATTR_KIND_SCALAR);
  offset->set_dtype(kF32);
  const float half = 0.5f;
  offset->set_data(std::string(reinterpret_cast<const char*>(&half), 4));
  if (attrs_only) return l;
  auto add = [&](testing::BufferSpec* b, int32_t dtype, int rank,
                 uint64_t offset_at, uint64_t size) {
    b->set_dtype(dtype);
    if (rank == 1) b->add_dims(4);
    b->set_offset(shapes_only ? 0 : offset_at);
    b->set_size(size);
  };
  add(l.add_args(), kF32, 1, 0, 16);
  add(l.add_rets(), kF32, 1, kYOffset, 16);
  add(l.add_rets(), kS64, 0, kNOffset, 8);
  return l;
}

v1::SessionRequest Instantiate(const std::string& target) {
  v1::SessionRequest r;
  r.mutable_instantiate()->set_descriptor(
      testing::EncodeSpec(Spec(target, 0, /*attrs_only=*/true)));
  return r;
}

v1::SessionRequest Stage(const std::string& target, uint64_t state,
                         uint32_t stage) {
  v1::SessionRequest r;
  r.mutable_stage_call()->set_descriptor(testing::EncodeSpec(
      Spec(target, state, /*attrs_only=*/false, /*shapes_only=*/true)));
  r.mutable_stage_call()->set_stage(stage);
  return r;
}

v1::SessionRequest Launch(const std::string& target, uint64_t state) {
  return testing::LaunchRequest(Spec(target, state, /*attrs_only=*/false), 0);
}

void Register(Daemon& d, const std::string& target, const std::string& prepare,
              bool with_initialize = false) {
  RegisterRequest req;
  req.target_name = target;
  req.stages = {{"instantiate", "CounterInstantiate"},
                {"execute", "CounterStagedExecute"}};
  if (!prepare.empty()) req.stages.emplace_back("prepare", prepare);
  if (with_initialize) {
    req.stages.emplace_back("initialize", "CounterStagedInitialize");
  }
  req.state_type_name = kStateType;
  req.state_type_id_symbol = "CounterStateTypeId";
  req.state_type_info_symbol = "CounterStateTypeInfo";
  req.platform = "cpu";
  req.module_bytes = testing::ReadFile(d.Kernel("libcounter_state.so"));
  auto resp = d.client().Register(req);
  INFO(resp.status().message());
  REQUIRE(resp.ok());
}

uint64_t InstantiateOk(Session& s, const std::string& target) {
  v1::SessionResponse resp = s.Send(Instantiate(target));
  INFO(resp.status().message());
  REQUIRE(resp.status().code() == 0);
  REQUIRE(resp.instantiate().state() != 0);
  return resp.instantiate().state();
}

TEST_CASE(
    "A bundle's prepare and initialize stages run in the executor with the "
    "call site's state",
    "[integration][state]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  Register(d, "staged", "CounterStagedPrepare", /*with_initialize=*/true);
  Session s(d);
  const float x[4] = {1, 2, 3, 4};
  std::memcpy(s.arena, x, sizeof(x));
  const uint64_t site = InstantiateOk(s, "staged");
  const uint64_t other = InstantiateOk(s, "staged");
  // buffer[i] = 0.5 * (i % 7) for i < 3, read at i % 3.
  const float buffer[4] = {0.0f, 0.5f, 1.0f, 0.0f};
  for (int round = 1; round <= 2; ++round) {
    // XLA:GPU's order per execution: prepare, initialize, execute.
    for (uint32_t stage : {kPrepare, kInitialize}) {
      v1::SessionResponse resp = s.Send(Stage("staged", site, stage));
      INFO(resp.status().message());
      REQUIRE(resp.status().code() == 0);
      CHECK(resp.has_stage_call());
    }
    v1::SessionResponse resp = s.Send(Launch("staged", site));
    INFO(resp.status().message());
    REQUIRE(resp.status().code() == 0);
    float y[4];
    int64_t n = 0;
    std::memcpy(y, s.arena + kYOffset, sizeof(y));
    std::memcpy(&n, s.arena + kNOffset, sizeof(n));
    for (int i = 0; i < 4; ++i) {
      CHECK(y[i] == x[i] + buffer[i] + round + 1000.0f * round);
    }
    // The stage saw every buffer's shape: 4 + 4 + 1 elements.
    CHECK(n == 9);
  }
  // The other call site's state saw no stage.
  v1::SessionResponse resp = s.Send(Launch("staged", other));
  REQUIRE(resp.status().code() == 0);
  float y0 = 0;
  int64_t n = -1;
  std::memcpy(&y0, s.arena + kYOffset, sizeof(y0));
  std::memcpy(&n, s.arena + kNOffset, sizeof(n));
  CHECK(y0 == x[0]);
  CHECK(n == 0);
}

TEST_CASE("Stage call refusals say what was wrong", "[integration][state]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  Register(d, "staged", "CounterStagedPrepare");
  Register(d, "noprep", "");
  Register(d, "perexec", "CounterPreparedState");
  Session s(d);
  const uint64_t site = InstantiateOk(s, "staged");

  SECTION("a stage other than prepare or initialize") {
    for (uint32_t stage : {0u, 3u, 4u, 77u}) {
      v1::SessionResponse resp = s.Send(Stage("staged", site, stage));
      CHECK(resp.status().code() ==
            static_cast<int>(absl::StatusCode::kInvalidArgument));
      CHECK_THAT(resp.status().message(),
                 Catch::Contains("not " + std::to_string(stage)) &&
                     Catch::Contains("prepare"));
    }
  }
  SECTION("a buffer that carries more than its shape") {
    v1::SessionRequest r;
    r.mutable_stage_call()->set_descriptor(
        testing::EncodeSpec(Spec("staged", site, /*attrs_only=*/false)));
    r.mutable_stage_call()->set_stage(kPrepare);
    v1::SessionResponse resp = s.Send(r);
    CHECK(resp.status().code() ==
          static_cast<int>(absl::StatusCode::kInvalidArgument));
    CHECK_THAT(resp.status().message(), Catch::Contains("ret 0") &&
                                            Catch::Contains("shape only") &&
                                            Catch::Contains("offset 64"));
  }
  SECTION("a state this process does not hold") {
    v1::SessionResponse resp = s.Send(Stage("staged", site + 1000, kPrepare));
    CHECK(resp.status().code() ==
          static_cast<int>(absl::StatusCode::kNotFound));
    CHECK_THAT(resp.status().message(),
               Catch::Contains(std::to_string(site + 1000)) &&
                   Catch::Contains("\"staged\""));
  }
  SECTION("a bundle without the stage") {
    const uint64_t plain = InstantiateOk(s, "noprep");
    v1::SessionResponse resp = s.Send(Stage("noprep", plain, kInitialize));
    CHECK(resp.status().code() ==
          static_cast<int>(absl::StatusCode::kFailedPrecondition));
    CHECK_THAT(resp.status().message(),
               Catch::Contains("\"noprep\"") &&
                   Catch::Contains("no initialize stage"));
  }
  SECTION("a per-execution state (ffi::Prepared<T>)") {
    const uint64_t per = InstantiateOk(s, "perexec");
    v1::SessionResponse resp = s.Send(Stage("perexec", per, kPrepare));
    CHECK(resp.status().code() ==
          static_cast<int>(absl::StatusCode::kUnimplemented));
    CHECK_THAT(resp.status().message(),
               Catch::Contains("per-execution states") &&
                   Catch::Contains("Prepared<T>") &&
                   Catch::Contains("execution=\"local\""));
  }
}

TEST_CASE("A crash in a prepare stage is contained like one in execute",
          "[integration][state]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  Register(d, "crashprep", "CounterCrashingPrepare");
  Register(d, "staged", "CounterStagedPrepare");
  {
    Session s(d);
    const uint64_t site = InstantiateOk(s, "crashprep");
    v1::SessionResponse resp = s.Send(Stage("crashprep", site, kPrepare));
    INFO(resp.status().message());
    CHECK(resp.status().code() != 0);
    CHECK_THAT(resp.status().message(),
               Catch::Contains("crashprep") &&
                   (Catch::Contains("signal 6") || Catch::Contains("SIGABRT")));
  }
  // kregd lives on; a new session gets a fresh executor.
  REQUIRE(::kill(d.pid(), 0) == 0);
  Session s(d);
  const uint64_t site = InstantiateOk(s, "staged");
  v1::SessionResponse resp = s.Send(Stage("staged", site, kPrepare));
  INFO(resp.status().message());
  CHECK(resp.status().code() == 0);
}

}  // namespace
}  // namespace kreg
