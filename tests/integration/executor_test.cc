// Executors against the real kregd (DESIGN §8): caller
// credentials, per-uid session limits and the Hello deadline, spoken over
// the raw session protocol. The cross-uid cases fork children that drop to
// test uids (root only; skipped with the reason otherwise): the test's own
// binaries and Python live under /root, which other uids cannot read, so
// the children are this process.
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

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
constexpr uint64_t kOutOffset = 64;

int Connect(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string Serialize(const v1::SessionRequest& r) {
  std::string s;
  r.SerializeToString(&s);
  return s;
}

std::string Hello(uint64_t id) {
  v1::SessionRequest r;
  r.set_id(id);
  r.mutable_hello()->set_protocol_major(kSessionProtocolMajor);
  r.mutable_hello()->set_protocol_minor(kSessionProtocolMinor);
  r.mutable_hello()->set_ffi_api_major(0);
  r.mutable_hello()->set_ffi_api_minor(1);
  return Serialize(r);
}

std::string Grow(uint64_t id) {
  v1::SessionRequest r;
  r.set_id(id);
  r.mutable_arena_grow()->set_size(kArenaBytes);
  return Serialize(r);
}

// A launch of a libhostile handler: f32[4] in at 0, s64[4] out at 64.
std::string Launch(uint64_t id, const std::string& target,
                   const std::string& path_attr = "") {
  testing::LaunchSpec l;
  l.set_target_name(target);
  l.set_platform("cpu");
  testing::BufferSpec* in = l.add_args();
  in->set_dtype(kF32);
  in->add_dims(4);
  in->set_offset(0);
  in->set_size(16);
  testing::BufferSpec* out = l.add_rets();
  out->set_dtype(kS64);
  out->add_dims(4);
  out->set_offset(kOutOffset);
  out->set_size(32);
  if (!path_attr.empty()) {
    v1::Attribute* a = l.add_attrs();
    a->set_name("path");
    a->set_kind(v1::ATTR_KIND_STRING);
    a->set_data(path_attr);
  }
  return Serialize(testing::LaunchRequest(l, id));
}

struct Out {
  int64_t v[4] = {0, 0, 0, 0};
};

// Per request: the response and the launch output area after it.
struct ChildResult {
  std::vector<v1::SessionResponse> responses;
  std::vector<Out> outs;
  bool ok = false;
};

// Forks a child that switches to `uid`/`gid`, opens a session on `path`,
// sends `requests` (an ArenaGrow gets a fresh sealed memfd attached),
// reports each response and the launch output, then holds its session
// until `hold_read` reaches EOF (when >= 0; `hold_write` is closed in the
// child). Returns its pid; results come through `*report_fd`.
pid_t StartChild(const std::string& path, uid_t uid, gid_t gid,
                 const std::vector<std::string>& requests, int hold_read,
                 int* report_fd, int hold_write = -1) {
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid > 0) {
    ::close(p[1]);
    *report_fd = p[0];
    return pid;
  }
  ::close(p[0]);
  if (hold_write >= 0) ::close(hold_write);
  auto write_all = [&](const void* data, size_t n) {
    const char* c = static_cast<const char*>(data);
    while (n > 0) {
      ssize_t w = ::write(p[1], c, n);
      if (w <= 0) ::_exit(3);
      c += w;
      n -= static_cast<size_t>(w);
    }
  };
  if (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0 ||
      ::setuid(uid) != 0) {
    ::_exit(4);
  }
  int sock = Connect(path);
  if (sock < 0) ::_exit(5);
  int memfd = ::memfd_create("kreg-arena", MFD_ALLOW_SEALING);
  if (::ftruncate(memfd, kArenaBytes) != 0 ||
      ::fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    ::_exit(6);
  }
  char* arena = static_cast<char*>(::mmap(
      nullptr, kArenaBytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0));
  for (const std::string& req : requests) {
    v1::SessionRequest parsed;
    parsed.ParseFromString(req);
    bool grow = parsed.has_arena_grow();
    if (wire::SendFrame(sock, req.data(), req.size(), &memfd, grow ? 1 : 0) !=
        wire::kOk) {
      ::_exit(7);
    }
    std::string reply;
    std::vector<int> fds;
    if (wire::RecvFrame(sock, 1 << 20, &reply, &fds) != wire::kOk) ::_exit(8);
    uint32_t n = static_cast<uint32_t>(reply.size());
    write_all(&n, sizeof(n));
    write_all(reply.data(), n);
    write_all(arena + kOutOffset, 32);
  }
  uint32_t end = 0xffffffffu;
  write_all(&end, sizeof(end));
  ::close(p[1]);
  if (hold_read >= 0) {
    char c;
    while (::read(hold_read, &c, 1) > 0) {
    }
  }
  ::_exit(0);
}

ChildResult ReadChild(int fd) {
  ChildResult r;
  auto read_all = [&](void* data, size_t n) {
    char* c = static_cast<char*>(data);
    while (n > 0) {
      ssize_t got = ::read(fd, c, n);
      if (got <= 0) return false;
      c += got;
      n -= static_cast<size_t>(got);
    }
    return true;
  };
  for (;;) {
    uint32_t n = 0;
    if (!read_all(&n, sizeof(n))) break;
    if (n == 0xffffffffu) {
      r.ok = true;
      break;
    }
    std::string bytes(n, '\0');
    Out out;
    if (!read_all(bytes.data(), n) || !read_all(out.v, sizeof(out.v))) break;
    r.responses.emplace_back();
    r.responses.back().ParseFromString(bytes);
    r.outs.push_back(out);
  }
  ::close(fd);
  return r;
}

// A kregd whose sockets other uids may reach.
void OpenToEveryone(const TempDir& dir, const Daemon& d) {
  ::chmod(dir.path().c_str(), 0755);
  ::chmod((d.socket() + ".session").c_str(), 0666);
}

std::string Register(Daemon& d, const std::string& target,
                     const std::string& func) {
  RegisterRequest req;
  req.target_name = target;
  req.func_name = func;
  req.platform = "cpu";
  req.module_bytes = testing::ReadFile(d.Kernel("libhostile.so"));
  auto resp = d.client().Register(req);
  REQUIRE(resp.ok());
  return resp->target().content_id();
}

TEST_CASE(
    "Executors run as their caller's uid; other uids' executors and "
    "kregd's state stay closed to them",
    "[integration][executors]") {
  if (::geteuid() != 0) {
    WARN("skipped: needs root to switch test clients to other uids");
    return;
  }
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  OpenToEveryone(dir, d);
  Register(d, "x.who", "WhoAmI");
  Register(d, "x.open", "TryOpen");
  const std::string path = d.socket() + ".session";

  // B: uid 54322 runs WhoAmI and keeps its session (and executor) open.
  int hold[2];
  REQUIRE(::pipe2(hold, O_CLOEXEC) == 0);
  int b_report = -1;
  pid_t b =
      StartChild(path, 54322, 54322, {Hello(1), Grow(2), Launch(3, "x.who")},
                 hold[0], &b_report, hold[1]);
  ::close(hold[0]);
  ChildResult rb = ReadChild(b_report);
  REQUIRE(rb.ok);
  REQUIRE(rb.responses.size() == 3);
  CHECK(rb.responses[2].status().code() == 0);
  const Out& who_b = rb.outs[2];
  CHECK(who_b.v[0] == 54322);
  CHECK(who_b.v[1] == 54322);
  const int64_t b_exec = who_b.v[2];
  CHECK(b_exec != d.pid());
  CHECK(who_b.v[3] == d.pid());

  // A: uid 54321; its handler cannot read B's executor or kregd's state.
  const std::string b_maps = "/proc/" + std::to_string(b_exec) + "/maps";
  int a_report = -1;
  pid_t a = StartChild(
      path, 54321, 54321,
      {Hello(1), Grow(2), Launch(3, "x.who"), Launch(4, "x.open", b_maps),
       Launch(5, "x.open", d.state_dir() + "/journal")},
      -1, &a_report);
  ChildResult ra = ReadChild(a_report);
  CHECK(testing::WaitExit(a) == 0);
  REQUIRE(ra.responses.size() == 5);
  for (const auto& r : ra.responses) {
    INFO(r.status().message());
    CHECK(r.status().code() == 0);
  }
  CHECK(ra.outs[2].v[0] == 54321);   // WhoAmI: A's own uid
  CHECK(ra.outs[2].v[2] != b_exec);  // in A's own executor
  CHECK(ra.outs[3].v[0] == -1);      // B's executor's memory map
  CHECK(ra.outs[3].v[1] == EACCES);
  CHECK(ra.outs[4].v[0] == -1);  // kregd's journal
  CHECK(ra.outs[4].v[1] == EACCES);
  ::close(hold[1]);
  CHECK(testing::WaitExit(b) == 0);

  // Two executors (one per client process, the default grouping), each
  // running as its client's uid.
  auto status = d.client().Status();
  REQUIRE(status.ok());
  CHECK(status->isolation() == "client");
  CHECK(status->executor_note().empty());
}

TEST_CASE("A handler gets its caller's file permissions, not kregd's",
          "[integration][executors]") {
  if (::geteuid() != 0) {
    WARN("skipped: needs root to switch test clients to other uids");
    return;
  }
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  OpenToEveryone(dir, d);
  Register(d, "x.open", "TryOpen");
  const std::string path = d.socket() + ".session";
  // A file only root may read: EACCES, as uid 54321 itself would get,
  // although kregd runs as root.
  int report = -1;
  pid_t a = StartChild(path, 54321, 54321,
                       {Hello(1), Grow(2), Launch(3, "x.open", "/etc/shadow")},
                       -1, &report);
  ChildResult ra = ReadChild(report);
  CHECK(testing::WaitExit(a) == 0);
  REQUIRE(ra.responses.size() == 3);
  CHECK(ra.responses[2].status().code() == 0);
  CHECK(ra.outs[2].v[0] == -1);
  CHECK(ra.outs[2].v[1] == EACCES);
}

TEST_CASE(
    "Sessions beyond max_sessions_per_uid are refused with a clear "
    "error; other uids still get in",
    "[integration][executors]") {
  TempDir dir;
  std::string config = dir.path() + "/kregd.toml";
  testing::WriteFile(config, "max_sessions_per_uid = 3\n");
  Daemon d(dir.path(), {"--config", config});
  d.Start();
  const std::string path = d.socket() + ".session";
  std::vector<int> held;
  for (int i = 0; i < 3; ++i) {
    int fd = Connect(path);
    REQUIRE(fd >= 0);
    std::string hello = Hello(1);
    REQUIRE(wire::SendFrame(fd, hello.data(), hello.size(), nullptr, 0) ==
            wire::kOk);
    std::string reply;
    std::vector<int> fds;
    REQUIRE(wire::RecvFrame(fd, 1 << 20, &reply, &fds) == wire::kOk);
    held.push_back(fd);
  }
  // Refused at its Hello (until then it is a connection waiting for its
  // first request, max_pending_connections_per_uid).
  int extra = Connect(path);
  REQUIRE(extra >= 0);
  std::string extra_hello = Hello(1);
  REQUIRE(wire::SendFrame(extra, extra_hello.data(), extra_hello.size(),
                          nullptr, 0) == wire::kOk);
  std::string reply;
  std::vector<int> fds;
  REQUIRE(wire::RecvFrame(extra, 1 << 20, &reply, &fds) == wire::kOk);
  v1::SessionResponse resp;
  REQUIRE(resp.ParseFromString(reply));
  CHECK(resp.id() == 0);
  CHECK(resp.status().code() ==
        static_cast<int>(absl::StatusCode::kResourceExhausted));
  CHECK_THAT(resp.status().message(),
             Catch::Contains("uid " + std::to_string(::getuid()) +
                             " holds 3 "
                             "sessions already; 1 more would exceed its "
                             "limit of 3 (max_sessions_per_uid)"));
  ::close(extra);
  if (::geteuid() == 0) {
    OpenToEveryone(dir, d);
    int report = -1;
    pid_t other = StartChild(path, 54321, 54321, {Hello(1)}, -1, &report);
    ChildResult r = ReadChild(report);
    CHECK(testing::WaitExit(other) == 0);
    REQUIRE(r.responses.size() == 1);
    CHECK(r.responses[0].status().code() == 0);
    CHECK(r.responses[0].has_hello());
  }
  // Closing one makes room again.
  ::close(held.back());
  held.pop_back();
  bool admitted = false;
  for (int i = 0; i < 50 && !admitted; ++i) {
    ::usleep(20000);
    int fd = Connect(path);
    std::string hello = Hello(1);
    wire::SendFrame(fd, hello.data(), hello.size(), nullptr, 0);
    std::string r2;
    std::vector<int> f2;
    v1::SessionResponse resp2;
    if (wire::RecvFrame(fd, 1 << 20, &r2, &f2) == wire::kOk &&
        resp2.ParseFromString(r2) && resp2.has_hello()) {
      admitted = true;
    }
    ::close(fd);
  }
  CHECK(admitted);
  for (int fd : held) ::close(fd);
}

TEST_CASE("A connection that never says Hello is closed with an error",
          "[integration][executors]") {
  TempDir dir;
  std::string config = dir.path() + "/kregd.toml";
  testing::WriteFile(config, "hello_timeout_s = 0.5\n");
  Daemon d(dir.path(), {"--config", config});
  d.Start();
  int fd = Connect(d.socket() + ".session");
  REQUIRE(fd >= 0);
  pollfd p{fd, POLLIN, 0};
  REQUIRE(::poll(&p, 1, 5000) == 1);
  std::string reply;
  std::vector<int> fds;
  REQUIRE(wire::RecvFrame(fd, 1 << 20, &reply, &fds) == wire::kOk);
  v1::SessionResponse resp;
  REQUIRE(resp.ParseFromString(reply));
  CHECK(resp.id() == 0);
  CHECK_THAT(resp.status().message(),
             Catch::Contains("no whole request within 500 ms of connecting"));
  char c;
  CHECK(::read(fd, &c, 1) == 0);  // then the session is closed
  ::close(fd);
}

TEST_CASE("Bad executor configuration values are refused at start",
          "[integration][executors]") {
  TempDir dir;
  std::string config = dir.path() + "/kregd.toml";
  testing::WriteFile(config, "hello_timeout_s = -1\n");
  auto r = testing::Run({testing::Runfile("daemon/kregd/kregd"), "--config",
                         config, "--socket", dir.path() + "/k.sock",
                         "--state-dir", dir.path() + "/state"});
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("hello_timeout_s"));
  CHECK_THAT(r.err, Catch::Contains("a number of seconds > 0"));
}

}  // namespace
}  // namespace kreg
