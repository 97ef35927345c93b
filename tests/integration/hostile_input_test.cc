// Hostile local clients against the real kregd (DESIGN §6): special files and
// other users' files under an allowed root, bytes that are not text, large
// upload chunks, length prefixes with nothing behind them, log floods. Each
// checks the message a person gets and that kregd keeps serving.
#include <grpcpp/grpcpp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "catch2/catch.hpp"
#include "kreg/v1/registry.grpc.pb.h"
#include "tests/testing/daemon_fixture.h"
#include "tests/testing/temp_dir.h"

namespace kreg {
namespace {

using testing::Daemon;
using testing::Kregctl;
using testing::ReadFile;
using testing::TempDir;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

RegisterRequest ByPath(const std::string& name, const std::string& path) {
  RegisterRequest r;
  r.target_name = name;
  r.func_name = "Scale";
  r.daemon_path = path;
  return r;
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

// VmRSS of `root` and all its descendants (kregd and its executors), KiB.
long TreeRssKib(pid_t root) {
  std::map<pid_t, pid_t> parent;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "stat");
    std::string stat;
    std::getline(in, stat);
    size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    parent[std::stoi(name)] = ppid;
  }
  long total = 0;
  for (const auto& [pid, ppid] : parent) {
    for (pid_t p = pid; p > 1; p = parent.count(p) ? parent[p] : 0) {
      if (p == root) {
        long rss = RssKib(pid);
        total += rss > 0 ? rss : 0;
        break;
      }
    }
  }
  return total;
}

// A session of `d`: connected, Hello said.
int ConnectSession(const Daemon& d) {
  std::string path = d.socket() + ".session";
  int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  REQUIRE(::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  // Hello (a SessionRequest with hello.protocol_major 2, encoded by hand),
  // so that what follows goes to the session's executor; its reply read.
  const unsigned char hello[] = {4, 0, 0, 0, 0x12, 2, 0x08, 2};
  REQUIRE(::send(s, hello, sizeof(hello), MSG_NOSIGNAL) == sizeof(hello));
  unsigned char len[4];
  REQUIRE(::recv(s, len, 4, MSG_WAITALL) == 4);
  std::string reply(len[0] | len[1] << 8 | len[2] << 16, '\0');
  REQUIRE(::recv(s, reply.data(), reply.size(), MSG_WAITALL) ==
          static_cast<ssize_t>(reply.size()));
  return s;
}

void SendLength(int sock, uint32_t len) {
  unsigned char h[4] = {static_cast<unsigned char>(len),
                        static_cast<unsigned char>(len >> 8),
                        static_cast<unsigned char>(len >> 16),
                        static_cast<unsigned char>(len >> 24)};
  REQUIRE(::send(sock, h, 4, MSG_NOSIGNAL) == 4);
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos;
       at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
}

TEST_CASE("A FIFO under an allowed root is refused at once; kregd serves on",
          "[integration][hostile]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  Client c = d.client();
  std::string fifo = d.modules_dir() + "/libfifo.so";
  REQUIRE(::mkfifo(fifo.c_str(), 0666) == 0);
  for (int i = 0; i < 5; ++i) {
    auto start = std::chrono::steady_clock::now();
    auto r = c.Register(ByPath("fifo.op", fifo));
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(Message(r.status()),
               Catch::Contains("\"" + fifo +
                               "\" is a FIFO (named pipe), not a regular "
                               "file"));
  }
  auto socket_file = c.Register(ByPath("sock.op", d.socket()));
  CHECK(socket_file.status().code() == absl::StatusCode::kPermissionDenied);
  REQUIRE(c.Register(ByPath("demo.op", d.Kernel("libdemo.so"))).ok());
  CHECK(c.Health().ok());
  CHECK(d.Stop() == 0);  // SIGTERM finishes: no thread is stuck on the FIFO
}

TEST_CASE("A daemon-side path with a NUL is refused, not cut",
          "[integration][hostile]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  std::string path = d.Kernel("libdemo.so") + std::string(1, '\0') + ".txt";
  auto r = d.client().Register(ByPath("nul.op", path));
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(
      Message(r.status()),
      Catch::Contains("libdemo.so\\x00.txt\"") &&
          Catch::Contains("contains a NUL byte at position " +
                          std::to_string(d.Kernel("libdemo.so").size())));
  CHECK(d.client().List()->empty());
}

TEST_CASE("Bytes that are not UTF-8 get a clear error and no log flood",
          "[integration][hostile]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  Client c = d.client();
  RegisterRequest req;
  req.func_name = "Scale";
  req.module_bytes = ReadFile(d.Kernel("libdemo.so"));
  for (int i = 0; i < 300; ++i) {
    req.target_name = "op\xff\xfe";
    auto r = c.Register(req);
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(Message(r.status()),
               Catch::Contains("target name \"op\\xff\\xfe\""));
  }
  req.target_name = "op";
  req.platform = "c\xc3(u";
  auto platform = c.Register(req);
  CHECK(platform.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(Message(platform.status()), Catch::Contains("\"c\\xc3(u\""));
  req.platform = "cpu";
  RegisterRequest path = ByPath("path.op", d.modules_dir() + "/lib\xff.so");
  auto bad_path = c.Register(path);
  CHECK(bad_path.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(Message(bad_path.status()),
             Catch::Contains("lib\\xff.so\" is not valid UTF-8"));
  auto get = c.Get("x\x80", "");
  CHECK(get.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(c.Health().ok());
  std::string log = d.log();
  CHECK_THAT(log, !Catch::Contains("libprotobuf") &&
                      !Catch::Contains("invalid UTF-8"));
  CHECK(log.size() < 16384);
}

TEST_CASE("An upload chunk over 4 MiB is refused with its size",
          "[integration][hostile]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  auto channel = grpc::CreateChannel("unix:" + d.socket(),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::Registry::NewStub(channel);
  grpc::ClientContext ctx;
  v1::RegisterTargetResponse resp;
  auto writer = stub->RegisterTarget(&ctx, &resp);
  std::string module = ReadFile(d.Kernel("libdemo.so"));
  module.resize(5u << 20, '\0');
  v1::RegisterTargetChunk header;
  header.mutable_header()->set_target_name("big.chunk");
  header.mutable_header()->set_func_name("Scale");
  header.mutable_header()->set_platform("cpu");
  header.mutable_header()->mutable_module()->set_upload_size(module.size());
  writer->Write(header);
  v1::RegisterTargetChunk chunk;
  chunk.set_module_bytes(module);
  writer->Write(chunk);
  writer->WritesDone();
  grpc::Status st = writer->Finish();
  CHECK(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(st.error_message(),
             Catch::Contains("upload chunk 1 carries 5242880 bytes") &&
                 Catch::Contains("at most 4194304"));
  // The same module in the client's 1 MiB chunks is accepted.
  RegisterRequest ok;
  ok.target_name = "big.chunk";
  ok.func_name = "Scale";
  ok.module_bytes = module;
  CHECK(d.client().Register(ok).ok());
}

TEST_CASE("Length prefixes with nothing behind them cost kregd no memory",
          "[integration][hostile]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  REQUIRE(d.client().Health().ok());
  // Sessions may be served by executor processes: count kregd's whole tree.
  // One session first, so that its executor is part of the baseline.
  int first = ConnectSession(d);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  long before = TreeRssKib(d.pid());
  REQUIRE(before > 0);
  std::vector<int> socks = {first};
  SendLength(first, 64u << 20);
  for (int i = 0; i < 19; ++i) {
    socks.push_back(ConnectSession(d));
    SendLength(socks.back(), 64u << 20);  // max_message_bytes: allowed
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  long after = TreeRssKib(d.pid());
  INFO("VmRSS of kregd and its children before " << before << " KiB, after "
                                                 << after << " KiB");
  // Reserving each announced frame would be 20 x 64 MiB = 1.25 GiB.
  CHECK(after - before < 128 * 1024);
  for (int s : socks) ::close(s);
  CHECK(d.client().Health().ok());
}

TEST_CASE(
    "Bytes buffered across a uid's sessions are bounded "
    "(max_buffered_bytes); its other sessions and kregd serve on",
    "[integration][hostile]") {
  TempDir dir;
  std::string config = dir.path() + "/kregd.toml";
  testing::WriteFile(config, "max_buffered_bytes = 8388608\n");  // 8 MiB
  Daemon d(dir.path(), {"--config", config});
  d.Start();
  // Session A sends 6 MiB of a 7 MiB message and holds it.
  int a = ConnectSession(d);
  SendLength(a, 7u << 20);
  std::string bytes(6u << 20, 'a');
  size_t sent = 0;
  while (sent < bytes.size()) {
    ssize_t n =
        ::send(a, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    REQUIRE(n > 0);
    sent += static_cast<size_t>(n);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // Session B (same uid, same executor) tries the same: refused, closed.
  int b = ConnectSession(d);
  SendLength(b, 7u << 20);
  std::string reply;
  sent = 0;
  while (sent < bytes.size()) {
    ssize_t n =
        ::send(b, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // kregd closed it
    sent += static_cast<size_t>(n);
  }
  char buf[4096];
  for (ssize_t n; (n = ::recv(b, buf, sizeof(buf), 0)) > 0;) {
    reply.append(buf, static_cast<size_t>(n));
  }
  ::close(b);
  INFO(reply);
  CHECK(reply.find("max_buffered_bytes") != std::string::npos);
  CHECK(reply.find("8388608") != std::string::npos);
  // A new session of the same uid still works for small messages (once
  // the executor has given B's bytes back: on a loaded machine that may
  // lag B's close a little, and until then a new Hello is refused over the
  // budget), and gRPC is unaffected.
  ssize_t n = 0;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (n <= 4 && std::chrono::steady_clock::now() < deadline) {
    int c = ConnectSession(d);
    SendLength(c, 0);  // an empty frame parses as an empty request
    n = ::recv(c, buf, sizeof(buf), 0);
    ::close(c);
    if (n <= 4) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(n > 4);  // a reply frame (the error: an empty request)
  ::close(a);
  CHECK(d.client().Health().ok());
}

TEST_CASE("Repeated session errors from one uid are rate-limited in the log",
          "[integration][hostile]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  for (int i = 0; i < 100; ++i) {
    int s = ConnectSession(d);
    SendLength(s, 0xffffffffu);  // over max_message_bytes
    char buf[512];
    while (::recv(s, buf, sizeof(buf), 0) > 0) {
    }
    ::close(s);
  }
  CHECK(d.client().Health().ok());
  std::string log = d.log();
  size_t lines = Count(log, "closing: message larger than the limit");
  INFO(log.substr(0, 4000));
  CHECK(lines >= 1);
  CHECK(lines <= 20);
}

TEST_CASE("A missing symbol: exit 2, the file name, the closest exports",
          "[integration][kregctl]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  auto up = Kregctl({"--socket", d.socket(), "register", "typo.op", "--module",
                     d.Kernel("libdemo.so"), "--function", "Scael"});
  CHECK(up.exit_code == 2);
  CHECK_THAT(up.err, Catch::Contains("symbol \"Scael\" in module "
                                     "\"libdemo.so\" (sha256:") &&
                         Catch::Contains("no symbol \"Scael\"") &&
                         Catch::Contains("closest first: Scale, "));
  auto by_path = Kregctl({"--socket", d.socket(), "register", "typo.op",
                          "--module", d.Kernel("libdemo.so"), "--function",
                          "addmull", "--daemon-reads"});
  CHECK(by_path.exit_code == 2);
  CHECK_THAT(by_path.err,
             Catch::Contains("in module \"" + d.Kernel("libdemo.so") +
                             "\" (sha256:") &&
                 Catch::Contains("closest first: AddMul, "));
  CHECK(d.client().List()->empty());
}

// Runs kregctl (copied to `bin`) as uid:gid with no supplementary groups.
testing::CommandResult KregctlAs(uid_t uid, gid_t gid, const std::string& bin,
                                 std::vector<std::string> args) {
  std::vector<std::string> argv = {
      "/usr/bin/setpriv", "--reuid=" + std::to_string(uid),
      "--regid=" + std::to_string(gid), "--clear-groups", bin};
  argv.insert(argv.end(), args.begin(), args.end());
  return testing::Run(argv);
}

TEST_CASE("Daemon-side paths are opened with the caller's credentials",
          "[integration][hostile][root]") {
  if (::geteuid() != 0) {
    WARN(
        "skipped: needs root (kregd switches to the caller's uid to open "
        "paths only when it runs as root, and the test runs callers as "
        "other uids with setpriv)");
    return;
  }
  if (::access("/usr/bin/setpriv", X_OK) != 0) {
    WARN("skipped: /usr/bin/setpriv (util-linux) is missing");
    return;
  }
  TempDir dir;
  ::chmod(dir.path().c_str(), 0755);
  Daemon d(dir.path());
  d.Start();
  ::chmod(d.socket().c_str(), 0666);
  std::string kregctl = dir.path() + "/kregctl";
  std::filesystem::copy_file(testing::Runfile("client/kregctl/kregctl"), kregctl);
  ::chmod(kregctl.c_str(), 0755);
  // modules/private: 0700, owned by uid 4243; modules/group: 0750, group
  // 4244; the module inside each is world-readable.
  for (auto [sub, mode, uid, gid] :
       {std::tuple<const char*, mode_t, uid_t, gid_t>{"private", 0700, 4243,
                                                      4243},
        {"group", 0750, 0, 4244}}) {
    std::string p = d.modules_dir() + "/" + sub;
    std::filesystem::create_directories(p);
    std::filesystem::copy_file(d.Kernel("libdemo.so"), p + "/libdemo.so");
    ::chmod((p + "/libdemo.so").c_str(), 0644);
    REQUIRE(::chown(p.c_str(), uid, gid) == 0);
    ::chmod(p.c_str(), mode);
  }
  auto reg = [&](uid_t uid, gid_t gid, const std::string& name,
                 const std::string& path) {
    return KregctlAs(uid, gid, kregctl,
                     {"--socket", d.socket(), "register", name, "--module",
                      path, "--function", "Scale", "--daemon-reads"});
  };
  std::string priv = d.modules_dir() + "/private/libdemo.so";
  auto refused = reg(4242, 4242, "priv.op", priv);
  CHECK(refused.exit_code == 1);
  CHECK_THAT(refused.err, Catch::Contains("permission denied") &&
                              Catch::Contains("as uid 4242"));
  auto grouped =
      reg(4242, 4242, "group.op", d.modules_dir() + "/group/libdemo.so");
  CHECK_THAT(grouped.err, Catch::Contains("as uid 4242"));
  // Readable ones still register, for the owner and for the group.
  auto pub = reg(4242, 4242, "pub.op", d.Kernel("libdemo.so"));
  CHECK(pub.exit_code == 0);
  CHECK(pub.err.empty());
  auto owner = reg(4243, 4243, "priv.op", priv);
  CHECK(owner.exit_code == 0);
  auto member =
      reg(4242, 4244, "group.op", d.modules_dir() + "/group/libdemo.so");
  CHECK(member.exit_code == 0);
  auto listed = d.client().Get("pub.op", "cpu");
  REQUIRE(listed.ok());
  CHECK(listed->at(0).audit().uid() == 4242);
  // A FIFO is still refused promptly on this path.
  REQUIRE(::mkfifo((d.modules_dir() + "/libfifo.so").c_str(), 0666) == 0);
  auto fifo = reg(4242, 4242, "fifo.op", d.modules_dir() + "/libfifo.so");
  CHECK(fifo.exit_code == 2);
  CHECK_THAT(fifo.err, Catch::Contains("is a FIFO (named pipe)"));
  CHECK(d.client().Health().ok());
}

}  // namespace
}  // namespace kreg
