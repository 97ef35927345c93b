// Hostile kernels and half frames against the real kregd (docs/design.md
// §3, §6, §8): a kernel that writes huge frames into every socket its
// executor holds to kregd, control connections (registrations kregd serves
// itself, module bytes as a sealed memfd) and their errors, and a first
// frame that stops halfway. Spoken over the raw session protocol.
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
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
constexpr int kCanceled = static_cast<int>(absl::StatusCode::kCancelled);

int Connect(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  return fd;
}

// VmRSS of `pid` in KiB.
long RssKib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

// The next frame on `sock` within `ms`, parsed; a response with status
// CANCELLED and message "eof"/"timeout"/... when none came.
v1::SessionResponse Next(int sock, int ms = 10000) {
  v1::SessionResponse resp;
  pollfd p{sock, POLLIN, 0};
  if (::poll(&p, 1, ms) != 1) {
    resp.mutable_status()->set_code(kCanceled);
    resp.mutable_status()->set_message("timeout");
    return resp;
  }
  std::string payload;
  std::vector<int> fds;
  int rc = wire::RecvFrame(sock, 1 << 20, &payload, &fds);
  for (int fd : fds) ::close(fd);
  if (rc != wire::kOk || !resp.ParseFromString(payload)) {
    resp.mutable_status()->set_code(kCanceled);
    resp.mutable_status()->set_message(rc == wire::kEof ? "eof" : "bad frame");
  }
  return resp;
}

v1::SessionResponse Call(int sock, const v1::SessionRequest& r, int fd = -1) {
  std::string out;
  r.SerializeToString(&out);
  REQUIRE(wire::SendFrame(sock, out.data(), out.size(), &fd, fd >= 0 ? 1 : 0) ==
          wire::kOk);
  return Next(sock);
}

void Hello(int sock) {
  v1::SessionRequest r;
  r.set_id(1);
  r.mutable_hello()->set_protocol_major(kSessionProtocolMajor);
  r.mutable_hello()->set_protocol_minor(kSessionProtocolMinor);
  v1::SessionResponse resp = Call(sock, r);
  INFO(resp.status().message());
  REQUIRE(resp.has_hello());
}

// A 1 MiB arena for `sock`, mapped here.
char* Arena(int sock) {
  int memfd = ::memfd_create("kreg-arena", MFD_ALLOW_SEALING | MFD_CLOEXEC);
  REQUIRE(::ftruncate(memfd, kArenaBytes) == 0);
  REQUIRE(::fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0);
  void* p = ::mmap(nullptr, kArenaBytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                   memfd, 0);
  REQUIRE(p != MAP_FAILED);
  v1::SessionRequest r;
  r.set_id(2);
  r.mutable_arena_grow()->set_size(kArenaBytes);
  v1::SessionResponse resp = Call(sock, r, memfd);
  ::close(memfd);
  INFO(resp.status().message());
  REQUIRE(resp.status().code() == 0);
  return static_cast<char*>(p);
}

void AddS64(testing::LaunchSpec* l, const std::string& name, int64_t value) {
  v1::Attribute* a = l->add_attrs();
  a->set_name(name);
  a->set_kind(v1::ATTR_KIND_SCALAR);
  a->set_dtype(kS64);
  a->set_data(std::string(reinterpret_cast<const char*>(&value), 8));
}

// A launch of a libhostile handler: f32[4] in at 0, s64[4] out at 64.
testing::LaunchSpec Spec(const std::string& target) {
  testing::LaunchSpec l;
  l.set_target_name(target);
  l.set_platform("cpu");
  testing::BufferSpec* in = l.add_args();
  in->set_dtype(kF32);
  in->add_dims(4);
  in->set_size(16);
  testing::BufferSpec* out = l.add_rets();
  out->set_dtype(kS64);
  out->add_dims(4);
  out->set_offset(kOutOffset);
  out->set_size(32);
  return l;
}

v1::SessionRequest Launch(uint64_t id, const std::string& target) {
  return testing::LaunchRequest(Spec(target), id);
}

const int64_t* Out(char* arena) {
  return reinterpret_cast<const int64_t*>(arena + kOutOffset);
}

void RegisterGrpc(Daemon& d, const std::string& target,
                  const std::string& func) {
  RegisterRequest req;
  req.target_name = target;
  req.func_name = func;
  req.module_bytes = testing::ReadFile(d.Kernel("libhostile.so"));
  auto resp = d.client().Register(req);
  INFO(resp.status().message());
  REQUIRE(resp.ok());
}

TEST_CASE(
    "A kernel writing huge frames into its executor's broker sockets "
    "cannot grow kregd; those sessions end with RESOURCE_EXHAUSTED",
    "[integration][hostile][executors]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  RegisterGrpc(d, "x.flood", "FloodBrokers");
  const std::string path = d.socket() + ".session";
  // 16 sessions of this process: one executor, 16 broker sockets.
  constexpr int kSessions = 16;
  std::vector<int> socks;
  for (int i = 0; i < kSessions; ++i) {
    socks.push_back(Connect(path));
    Hello(socks.back());
  }
  char* arena = Arena(socks[0]);
  const long before = RssKib(d.pid());
  REQUIRE(before > 0);

  // Each broker socket: a frame announcing 400 MiB, then 64 MiB of it.
  testing::LaunchSpec spec = Spec("x.flood");
  AddS64(&spec, "announce", int64_t{400} << 20);
  AddS64(&spec, "send", int64_t{64} << 20);
  v1::SessionRequest flood = testing::LaunchRequest(spec, 3);
  std::string out;
  flood.SerializeToString(&out);
  REQUIRE(wire::SendFrame(socks[0], out.data(), out.size(), nullptr, 0) ==
          wire::kOk);
  long peak = before;
  const auto start = std::chrono::steady_clock::now();
  while (__atomic_load_n(&Out(arena)[3], __ATOMIC_ACQUIRE) != 1 &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(90)) {
    peak = std::max(peak, RssKib(d.pid()));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(Out(arena)[3] == 1);  // the kernel is done
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  peak = std::max(peak, RssKib(d.pid()));
  INFO("kregd VmRSS before "
       << before << " KiB, peak " << peak << " KiB; the kernel found "
       << Out(arena)[0] << " sockets to kregd, sent " << Out(arena)[1]
       << " bytes, " << Out(arena)[2] << " stopped with an error");
  // Buffering what was sent would be 16 x 64 MiB = 1 GiB. Growth, not the
  // whole RSS: an ASan kregd at -O0 starts at ~200 MiB.
  CHECK(peak - before < 160 * 1024);
  CHECK(Out(arena)[0] >= kSessions);  // the brokers (and the control socket)
  // kregd hung up on each broker after its header: the kernel got rid of
  // little more than the sockets' own buffers.
  CHECK(Out(arena)[2] >= kSessions);
  CHECK(Out(arena)[1] < (int64_t{64} << 20));

  // Every session of that executor ends with kregd's error naming the limit.
  for (int s : socks) {
    v1::SessionResponse resp = Next(s, 3000);
    while (resp.id() != 0 && resp.status().code() != kCanceled) {
      resp = Next(s, 3000);  // e.g. the flood's own launch reply
    }
    INFO(resp.status().message());
    CHECK(resp.id() == 0);
    CHECK(resp.status().code() ==
          static_cast<int>(absl::StatusCode::kResourceExhausted));
    CHECK_THAT(resp.status().message(),
               Catch::Contains("over the limit for executor messages (65536 "
                               "bytes"));
    CHECK(Next(s, 3000).status().message() == "eof");
    ::close(s);
  }
  CHECK_THAT(d.log(),
             Catch::Contains("sent kregd a broker message it does not read"));

  // kregd serves on: a new session registers, resolves and launches.
  RegisterGrpc(d, "x.who", "WhoAmI");
  int fresh = Connect(path);
  Hello(fresh);
  char* fresh_arena = Arena(fresh);
  v1::SessionResponse resp = Call(fresh, Launch(3, "x.who"));
  INFO(resp.status().message());
  CHECK(resp.status().code() == 0);
  CHECK(Out(fresh_arena)[3] == d.pid());  // WhoAmI: ppid is kregd
  ::close(fresh);
  CHECK(d.client().Health().ok());
  CHECK(RssKib(d.pid()) - before < 160 * 1024);
}

v1::SessionRequest RegisterIn(uint64_t id, const std::string& target,
                              const std::string& func) {
  v1::SessionRequest r;
  r.set_id(id);
  v1::RegisterTargetHeader* reg = r.mutable_register_target();
  reg->set_target_name(target);
  reg->set_func_name(func);
  reg->set_platform("cpu");
  return r;
}

int ModuleMemfd(const std::string& bytes, bool seal) {
  int fd = ::memfd_create("module", MFD_ALLOW_SEALING | MFD_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, bytes.data(), bytes.size()) ==
          static_cast<ssize_t>(bytes.size()));
  if (seal) {
    REQUIRE(::fcntl(fd, F_ADD_SEALS,
                    F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) ==
            0);
  }
  return fd;
}

// `r` with `fds` attached on `sock`; the reply.
v1::SessionResponse CallFds(int sock, const v1::SessionRequest& r,
                            std::vector<int> fds) {
  std::string out;
  r.SerializeToString(&out);
  REQUIRE(wire::SendFrame(sock, out.data(), out.size(), fds.data(),
                          static_cast<int>(fds.size())) == wire::kOk);
  return Next(sock);
}

v1::SessionRequest UploadIn(uint64_t id, const std::string& target,
                            uint64_t size) {
  v1::SessionRequest r = RegisterIn(id, target, "WhoAmI");
  r.mutable_register_target()->mutable_module()->set_upload_size(size);
  return r;
}

TEST_CASE(
    "A control connection registers and lists with one request and one "
    "reply each, served by kregd with no executor; it holds what it "
    "registered until it closes",
    "[integration][control]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  const std::string module = testing::ReadFile(d.Kernel("libhostile.so"));
  int s = Connect(d.socket() + ".session");
  // One frame out, one frame back: Next() fails on anything else.
  int fd = ModuleMemfd(module, /*seal=*/true);
  v1::SessionResponse resp =
      CallFds(s, UploadIn(4, "c.who", module.size()), {fd});
  ::close(fd);
  INFO(resp.status().message());
  REQUIRE(resp.status().code() == 0);
  CHECK(resp.id() == 4);
  CHECK(resp.register_target().created());
  CHECK(resp.register_target().target().module_size() == module.size());
  CHECK(resp.register_target().target().audit().uid() == ::getuid());
  v1::SessionRequest list;
  list.set_id(5);
  list.mutable_list();
  resp = Call(s, list);
  CHECK(resp.id() == 5);
  REQUIRE(resp.list().targets_size() == 1);
  CHECK(resp.list().targets(0).target_name() == "c.who");
  // Nothing else arrived, and no executor was started for it.
  pollfd p{s, POLLIN, 0};
  CHECK(::poll(&p, 1, 100) == 0);
  auto status = d.client().Status();
  REQUIRE(status.ok());
  CHECK(status->executors_started() == 0);
  CHECK(status->executors_size() == 0);
  // Not a session: control connections have their own per-uid cap
  // (max_control_connections_per_uid).
  CHECK(status->sessions() == 0);
  // Held: retiring it is refused while the connection is open.
  CHECK_FALSE(d.client().Retire("c.who", "cpu").ok());
  // A session runs what the control connection registered.
  int session = Connect(d.socket() + ".session");
  Hello(session);
  char* arena = Arena(session);
  resp = Call(session, Launch(3, "c.who"));
  INFO(resp.status().message());
  CHECK(resp.status().code() == 0);
  CHECK(Out(arena)[3] == d.pid());
  ::close(session);
  ::close(s);
  // Released on close.
  bool retired = false;
  for (int i = 0; i < 100 && !retired; ++i) {
    retired = d.client().Retire("c.who", "cpu").ok();
    if (!retired) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(retired);
}

TEST_CASE(
    "A control connection refuses bad uploads with their reason and "
    "carries on; any other request is refused and closes it",
    "[integration][control][hostile]") {
  TempDir dir;
  std::string config = dir.path() + "/kregd.toml";
  // 4 MiB: above the kernel built with ASan (1.8 MB), below the 8 MiB
  // upload refused below.
  testing::WriteFile(config, "max_module_bytes = 4194304\n");
  Daemon d(dir.path(), {"--config", config});
  d.Start();
  const std::string module = testing::ReadFile(d.Kernel("libhostile.so"));
  const std::string path = d.socket() + ".session";
  int s = Connect(path);
  auto refused = [&](v1::SessionResponse resp, const std::string& text) {
    INFO(resp.status().message());
    CHECK(resp.status().code() ==
          static_cast<int>(absl::StatusCode::kInvalidArgument));
    CHECK_THAT(resp.status().message(), Catch::Contains(text));
  };
  // Unsealed: its bytes could change after kregd checked them.
  int open_fd = ModuleMemfd(module, /*seal=*/false);
  refused(CallFds(s, UploadIn(1, "c.open", module.size()), {open_fd}),
          "the module memfd attached to the upload is not sealed against "
          "writing, shrinking and growing");
  // Sealed, but not of the announced size.
  int sealed = ModuleMemfd(module, /*seal=*/true);
  refused(CallFds(s, UploadIn(2, "c.size", module.size() + 1), {sealed}),
          "holds " + std::to_string(module.size()) + " bytes, not the " +
              std::to_string(module.size() + 1) + " announced");
  // Two descriptors.
  refused(CallFds(s, UploadIn(3, "c.two", module.size()), {sealed, open_fd}),
          "the registration carries 2 file descriptor(s); an upload "
          "(module.upload_size) needs exactly one");
  // Over max_module_bytes, with a pipe attached: refused before a byte is
  // read (reading a pipe with pread fails, and would say so).
  int pipe_fds[2];
  REQUIRE(::pipe2(pipe_fds, O_CLOEXEC) == 0);
  v1::SessionResponse resp =
      CallFds(s, UploadIn(4, "c.big", 8 << 20), {pipe_fds[0]});
  refused(resp,
          "uploaded module is 8388608 bytes; the limit is 4194304 "
          "(max_module_bytes)");
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  ::close(open_fd);
  // Still serving: the sealed one registers.
  resp = CallFds(s, UploadIn(5, "c.ok", module.size()), {sealed});
  ::close(sealed);
  INFO(resp.status().message());
  CHECK(resp.status().code() == 0);
  // A launch on it: refused, naming it and what to do; then closed.
  resp = Call(s, Launch(6, "c.ok"));
  CHECK(resp.id() == 6);
  CHECK(resp.status().code() ==
        static_cast<int>(absl::StatusCode::kFailedPrecondition));
  CHECK(resp.status().message() ==
        "kregd refused a launch request on a control connection (a "
        "connection to the session socket whose first request was not "
        "hello): it serves only control_hello, register_target, list and "
        "watch; send "
        "launch on a session (a connection whose first request is hello). "
        "Closing this connection");
  CHECK(Next(s).status().message() == "eof");
  ::close(s);
  // The first request neither Hello nor a control request: the same.
  s = Connect(path);
  v1::SessionRequest grow;
  grow.set_id(1);
  grow.mutable_arena_grow()->set_size(4096);
  resp = Call(s, grow);
  CHECK_THAT(resp.status().message(),
             Catch::StartsWith("kregd refused a arena_grow request on a "
                               "control connection"));
  CHECK(Next(s).status().message() == "eof");
  ::close(s);
  // A Hello after a control request: refused too.
  s = Connect(path);
  v1::SessionRequest list;
  list.set_id(1);
  list.mutable_list();
  CHECK(Call(s, list).status().code() == 0);
  v1::SessionRequest hello;
  hello.set_id(2);
  hello.mutable_hello()->set_protocol_major(kSessionProtocolMajor);
  CHECK_THAT(Call(s, hello).status().message(),
             Catch::StartsWith("kregd refused a hello request on a control "
                               "connection"));
  ::close(s);
  // A request over the control limit, first or later.
  v1::SessionRequest long_reg = RegisterIn(7, "c.long", "WhoAmI");
  long_reg.mutable_register_target()->mutable_module()->set_file_name(
      std::string(80000, 'f'));
  s = Connect(path);
  resp = Call(s, long_reg);
  CHECK(resp.id() == 0);
  CHECK(resp.status().message() ==
        "kregd closed this connection: its first message is over 65536 "
        "bytes, more than a hello or a control request (register_target, "
        "list) may be; module bytes go as a sealed memfd");
  ::close(s);
  s = Connect(path);
  CHECK(Call(s, list).status().code() == 0);
  resp = Call(s, long_reg);
  CHECK(resp.id() == 0);
  CHECK_THAT(resp.status().message(),
             Catch::StartsWith("kregd closed this control connection: "));
  ::close(s);
  auto listed = d.client().List();
  REQUIRE(listed.ok());
  CHECK(listed->size() == 1);
}

TEST_CASE("Control connections have their own per-uid cap, apart from sessions",
          "[integration][control]") {
  TempDir dir;
  std::string config = dir.path() + "/kregd.toml";
  testing::WriteFile(config,
                     "max_sessions_per_uid = 1\n"
                     "max_control_connections_per_uid = 2\n");
  Daemon d(dir.path(), {"--config", config});
  d.Start();
  const std::string path = d.socket() + ".session";
  v1::SessionRequest list;
  list.set_id(1);
  list.mutable_list();
  // Two control connections, though max_sessions_per_uid is 1: they are
  // not sessions.
  int first = Connect(path);
  CHECK(Call(first, list).status().code() == 0);
  int second = Connect(path);
  CHECK(Call(second, list).status().code() == 0);
  // A third is over max_control_connections_per_uid.
  int third = Connect(path);
  v1::SessionResponse resp = Call(third, list);
  CHECK(resp.id() == 0);
  CHECK(resp.status().code() ==
        static_cast<int>(absl::StatusCode::kResourceExhausted));
  CHECK_THAT(resp.status().message(),
             Catch::Contains("kregd refused this control connection: uid " +
                             std::to_string(::getuid()) +
                             " holds 2 control connections already; 1 more "
                             "would exceed its limit of 2 "
                             "(max_control_connections_per_uid)"));
  ::close(third);
  ::close(second);
  // A slot given back is free again.
  int fourth = -1;
  for (int i = 0; i < 100; ++i) {
    fourth = Connect(path);
    if (Call(fourth, list).status().code() == 0) break;
    ::close(fourth);
    fourth = -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(fourth >= 0);
  if (fourth >= 0) ::close(fourth);
  ::close(first);
}

TEST_CASE(
    "kregd refuses a session protocol 1.8 client at Hello, saying who is "
    "older and what to do",
    "[integration][executors]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  int s = Connect(d.socket() + ".session");
  v1::SessionRequest r;
  r.set_id(1);
  r.mutable_hello()->set_protocol_major(1);
  r.mutable_hello()->set_protocol_minor(8);
  v1::SessionResponse resp = Call(s, r);
  CHECK(resp.status().code() ==
        static_cast<int>(absl::StatusCode::kFailedPrecondition));
  CHECK(resp.status().message() ==
        "the client library speaks session protocol 1.8 and kregd 2.0: the "
        "client library is older. Update the client library (the kreg "
        "wheel) so that both are from the same release");
  ::close(s);
}

TEST_CASE(
    "Half a first frame, or one trickled byte by byte, is closed at the "
    "Hello deadline",
    "[integration][hostile][executors]") {
  TempDir dir;
  std::string config = dir.path() + "/kregd.toml";
  testing::WriteFile(config, "hello_timeout_s = 0.5\n");
  Daemon d(dir.path(), {"--config", config});
  d.Start();
  const std::string path = d.socket() + ".session";
  const auto start = std::chrono::steady_clock::now();
  // A 4-byte length (100) and 10 of its bytes, then nothing.
  int half = Connect(path);
  const char partial[14] = {100, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  REQUIRE(::send(half, partial, sizeof(partial), MSG_NOSIGNAL) == 14);
  // Another sends the length, then one byte every 100 ms.
  int trickle = Connect(path);
  std::thread trickler([trickle] {
    const char len[4] = {100, 0, 0, 0};
    ::send(trickle, len, 4, MSG_NOSIGNAL);
    for (int i = 0; i < 50; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (::send(trickle, "x", 1, MSG_NOSIGNAL) != 1) break;
    }
  });
  // And one says nothing at all.
  int silent = Connect(path);
  for (int s : {half, trickle, silent}) {
    v1::SessionResponse resp = Next(s, 5000);
    INFO(resp.status().message());
    CHECK(resp.id() == 0);
    CHECK(resp.status().code() ==
          static_cast<int>(absl::StatusCode::kDeadlineExceeded));
    CHECK(resp.status().message() ==
          "kregd closed this connection: no whole request within 500 ms of "
          "connecting (hello_timeout_s); send hello (a session) or a "
          "control_hello, register_target or list request (a control "
          "connection) at once");
    CHECK(Next(s, 5000).status().message() == "eof");
  }
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took >= std::chrono::milliseconds(400));
  CHECK(took < std::chrono::seconds(4));
  trickler.join();
  ::close(half);
  ::close(trickle);
  ::close(silent);
  // A complete Hello still opens a session.
  int good = Connect(path);
  Hello(good);
  ::close(good);
}

TEST_CASE(
    "After Hello a session may idle, but half a message is closed at the "
    "deadline",
    "[integration][hostile][executors]") {
  TempDir dir;
  std::string config = dir.path() + "/kregd.toml";
  testing::WriteFile(config, "hello_timeout_s = 0.5\n");
  Daemon d(dir.path(), {"--config", config});
  d.Start();
  const std::string path = d.socket() + ".session";
  int idle = Connect(path);
  Hello(idle);
  int half = Connect(path);
  Hello(half);
  // Idle for longer than the deadline: nothing happens.
  std::this_thread::sleep_for(std::chrono::milliseconds(900));
  pollfd p{idle, POLLIN, 0};
  CHECK(::poll(&p, 1, 0) == 0);
  // Then a 4-byte length (100) and 10 of its bytes, and nothing more.
  const auto start = std::chrono::steady_clock::now();
  const char partial[14] = {100, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  REQUIRE(::send(half, partial, sizeof(partial), MSG_NOSIGNAL) == 14);
  v1::SessionResponse resp = Next(half, 5000);
  INFO(resp.status().message());
  CHECK(resp.id() == 0);
  CHECK(resp.status().code() ==
        static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  CHECK(resp.status().message() ==
        "kregd closed this session: a message did not arrive whole within "
        "500 ms of its first byte (hello_timeout_s)");
  CHECK(Next(half, 5000).status().message() == "eof");
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(took >= std::chrono::milliseconds(400));
  CHECK(took < std::chrono::seconds(4));
  // The idle session still works.
  v1::SessionRequest list;
  list.set_id(2);
  list.mutable_list();
  std::string out;
  list.SerializeToString(&out);
  REQUIRE(wire::SendFrame(idle, out.data(), out.size(), nullptr, 0) ==
          wire::kOk);
  v1::SessionResponse listed = Next(idle, 5000);
  CHECK(listed.id() == 2);
  CHECK_THAT(
      listed.status().message(),
      Catch::StartsWith("register_target, list and control_hello are not "
                        "served in a session"));
  ::close(half);
  ::close(idle);
}

TEST_CASE(
    "Sessions announcing large messages keep their executor within "
    "max_buffered_bytes, and the memory goes back when they end",
    "[integration][hostile][executors]") {
  TempDir dir;
  std::string config = dir.path() + "/kregd.toml";
  // A 256 MiB budget; half-sent messages may wait 60 s.
  testing::WriteFile(config,
                     "max_buffered_bytes = 268435456\nhello_timeout_s = 60\n");
  Daemon d(dir.path(), {"--config", config});
  d.Start();
  const std::string path = d.socket() + ".session";
  // 40 sessions of this process (one executor); each announces a 64 MiB
  // message and sends 24 MiB of it: 960 MiB if nothing held them back.
  constexpr int kSessions = 40;
  std::vector<int> socks;
  for (int i = 0; i < kSessions; ++i) {
    socks.push_back(Connect(path));
    Hello(socks.back());
  }
  auto status = d.client().Status();
  REQUIRE(status.ok());
  REQUIRE(status->executors_size() == 1);
  const pid_t exec_pid = status->executors(0).pid();
  const long baseline = RssKib(exec_pid);
  REQUIRE(baseline > 0);
  const std::string chunk(1 << 20, 'x');
  long peak = baseline;
  int refused = 0;
  for (int s : socks) {
    const uint32_t announce = 64u << 20;
    char len[4];
    std::memcpy(len, &announce, 4);
    REQUIRE(::send(s, len, 4, MSG_NOSIGNAL) == 4);
    for (int mib = 0; mib < 24; ++mib) {
      pollfd p{s, POLLOUT, 0};
      if (::poll(&p, 1, 2000) != 1 || (p.revents & (POLLERR | POLLHUP))) {
        break;
      }
      if (::send(s, chunk.data(), chunk.size(), MSG_NOSIGNAL) < 0) break;
    }
    peak = std::max(peak, RssKib(exec_pid));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  peak = std::max(peak, RssKib(exec_pid));
  for (int s : socks) {
    v1::SessionResponse resp = Next(s, 200);
    if (resp.id() == 0 &&
        resp.status().code() ==
            static_cast<int>(absl::StatusCode::kResourceExhausted)) {
      ++refused;
      CHECK_THAT(resp.status().message(),
                 Catch::Contains("max_buffered_bytes"));
    }
  }
  INFO("executor VmRSS baseline " << baseline << " KiB, peak " << peak
                                  << " KiB; " << refused << " refused");
  CHECK(refused > 0);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // ASan's allocator keeps freed memory in its quarantine, and TSan adds
  // shadow memory for every byte the executor touches (peak about 5x the
  // budget): RSS says nothing about the executor's own accounting there.
  WARN("ASan/TSan build: RSS bounds not checked (peak " << peak << " KiB)");
  for (int s : socks) ::close(s);
  return;
#endif
  // The budget plus slack for what the kernel's socket buffers and the
  // allocator hold beyond it.
  CHECK(peak < baseline + (256 + 64) * 1024);
  for (int s : socks) ::close(s);
  // Memory given back: within a few seconds the executor is near its
  // baseline again (it stays up: the test holds no session, but it is not
  // idle long enough to exit).
  long after = 0;
  for (int i = 0; i < 50; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    after = RssKib(exec_pid);
    if (after < baseline + 32 * 1024) break;
  }
  INFO("after closing: " << after << " KiB");
  CHECK(after > 0);
  CHECK(after < baseline + 32 * 1024);
}

TEST_CASE(
    "A watch connection: one per process, and only small repoint_acks "
    "without descriptors (docs/replace.md section 4)",
    "[integration][control][watch]") {
  TempDir dir;
  Daemon d(dir.path(), {"--replace", "owner"});
  d.Start();
  const std::string path = d.socket() + ".session";
  v1::SessionRequest watch;
  watch.set_id(1);
  watch.mutable_watch();
  auto open_watch = [&] {
    int s = Connect(path);
    v1::SessionResponse resp = Call(s, watch);
    INFO(resp.status().message());
    REQUIRE(resp.has_watch());
    return s;
  };
  auto refused = [&](int s, const std::string& message) {
    v1::SessionResponse resp = Next(s);
    CHECK(resp.id() == 0);
    CHECK(resp.status().message() == message);
    CHECK(Next(s).status().message() == "eof");
    ::close(s);
  };
  int first = open_watch();
  int second = Connect(path);
  v1::SessionResponse again = Call(second, watch);
  CHECK(again.status().code() ==
        static_cast<int>(absl::StatusCode::kFailedPrecondition));
  CHECK_THAT(again.status().message(),
             Catch::StartsWith("kregd refused a watch connection of pid " +
                               std::to_string(::getpid()) +
                               ": that process has one already"));
  CHECK(Next(second).status().message() == "eof");
  ::close(second);

  // Over kMaxRepointAckBytes: refused before it is read.
  const std::string big(20000, 'x');
  REQUIRE(wire::SendFrame(first, big.data(), big.size(), nullptr, 0) ==
          wire::kOk);
  refused(first, "kregd closed this watch connection: " +
                     wire::ResultText(wire::kTooLarge) +
                     " (a repoint_ack is at most 16384 bytes and arrives whole "
                     "within 10000 ms of its first byte)");

  // Another request than repoint_ack (the watch was let go: a new one).
  int s = open_watch();
  v1::SessionRequest list;
  list.set_id(2);
  list.mutable_list();
  std::string out;
  list.SerializeToString(&out);
  REQUIRE(wire::SendFrame(s, out.data(), out.size(), nullptr, 0) == wire::kOk);
  refused(s,
          "kregd closed this watch connection: it reads only repoint_ack "
          "there, not list; send other requests on a control connection or "
          "a session");

  // An ack with a descriptor.
  s = open_watch();
  v1::SessionRequest ack;
  ack.mutable_repoint_ack()->set_target_name("demo.t");
  ack.mutable_repoint_ack()->set_platform("cpu");
  ack.SerializeToString(&out);
  int fd = ::memfd_create("stray", MFD_CLOEXEC);
  REQUIRE(wire::SendFrame(s, out.data(), out.size(), &fd, 1) == wire::kOk);
  ::close(fd);
  refused(s,
          "kregd closed this watch connection: a repoint_ack carries no "
          "file descriptor, and 1 came with it");
}

TEST_CASE(
    "A process whose watch opens while a replacement waits for it switches "
    "(docs/replace.md section 4)",
    "[integration][watch]") {
  TempDir dir;
  Daemon d(dir.path(), {"--replace", "owner"});
  d.Start();
  auto upload = [&](const std::string& lib) {
    RegisterRequest r;
    r.target_name = "demo.w";
    r.func_name = "Scale";
    r.module_bytes = testing::ReadFile(d.Kernel(lib));
    return r;
  };
  REQUIRE(d.client().Register(upload("libdemo.so")).ok());
  // The first replaceable local bind: kregd records the hold, and the
  // process opens its watch after the reply.
  const std::string path = d.socket() + ".session";
  int s = Connect(path);
  Hello(s);
  v1::SessionRequest bind;
  bind.set_id(2);
  bind.mutable_bind_local()->set_target_name("demo.w");
  bind.mutable_bind_local()->set_platform("cpu");
  v1::SessionResponse bound = Call(s, bind);
  INFO(bound.status().message());
  REQUIRE(bound.bind_local().replaceable());
  RegisterRequest next = upload("libdemo_v2.so");
  next.replace = true;
  absl::Status replaced = absl::UnknownError("not run");
  std::thread t([&] { replaced = d.client().Register(next).status(); });
  // The replacement waits for this process (a pause makes it likely that
  // it started before the watch opens; either order passes).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  int w = Connect(path);
  v1::SessionRequest watch;
  watch.set_id(1);
  watch.mutable_watch();
  REQUIRE(Call(w, watch).has_watch());
  v1::SessionResponse notice = Next(w);
  REQUIRE(notice.has_repoint());
  CHECK(notice.repoint().generation() == 2);
  v1::SessionRequest ack;
  ack.mutable_repoint_ack()->set_target_name("demo.w");
  ack.mutable_repoint_ack()->set_platform("cpu");
  ack.mutable_repoint_ack()->set_generation(2);
  std::string out;
  ack.SerializeToString(&out);
  REQUIRE(wire::SendFrame(w, out.data(), out.size(), nullptr, 0) == wire::kOk);
  t.join();
  CHECK(replaced.message() == "");
  CHECK(replaced.ok());
  ::close(w);
  ::close(s);
}

}  // namespace
}  // namespace kreg
