#include "daemon/api/session_server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "catch2/catch.hpp"
#include "common/wire.h"
#include "daemon/executor/session.h"

namespace kreg {
namespace {

class NullBackend : public SessionBackend {
 public:
  absl::StatusOr<ResolvedHandler> Lookup(const TargetKey&, uint32_t) override {
    return absl::NotFoundError("no");
  }
  absl::Status Execute(void*, const LaunchFrame&) override {
    return absl::OkStatus();
  }
  uint32_t ffi_api_major() const override { return 0; }
  uint32_t ffi_api_minor() const override { return 4; }
};

// Sessions served in the test's process over a NullBackend (kregd's own
// factory hands connections to executors instead).
SessionFactory InProcess() {
  auto backend = std::make_shared<NullBackend>();
  auto counters = std::make_shared<SessionCounters>();
  return [backend, counters](uint64_t id, UniqueFd sock, const PeerCred& peer) {
    return std::make_shared<Session>(id, std::move(sock), peer, SessionLimits{},
                                     backend.get(), counters.get());
  };
}

UniqueFd Connect(const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, path.c_str());
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) !=
      0) {
    return UniqueFd();
  }
  return fd;
}

v1::SessionResponse Hello(int fd) {
  v1::SessionRequest r;
  r.mutable_hello()->set_protocol_major(kSessionProtocolMajor);
  std::string out = r.SerializeAsString();
  REQUIRE(wire::SendFrame(fd, out.data(), out.size(), nullptr, 0) == 0);
  std::string in;
  std::vector<int> fds;
  REQUIRE(wire::RecvFrame(fd, 1 << 20, &in, &fds) == 0);
  v1::SessionResponse resp;
  REQUIRE(resp.ParseFromString(in));
  return resp;
}

// Socket paths must fit sun_path (108 bytes): TEST_TMPDIR is too deep.
class ShortTempDir {
 public:
  ShortTempDir() {
    char tmpl[] = "/tmp/kss-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~ShortTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

bool WaitFor(const std::function<bool()>& cond) {
  for (int i = 0; i < 500; ++i) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

SessionOptions Opts(const std::string& path) {
  SessionOptions o;
  o.socket_path = path;
  return o;
}

TEST_CASE("Server listens 0660, counts and releases sessions", "[server]") {
  ShortTempDir dir;
  std::string path = dir.path() + "/kregd.sock.session";
  SessionServer server(Opts(path), InProcess());
  REQUIRE(server.Start().ok());
  struct stat st;
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0660);

  UniqueFd a = Connect(path);
  UniqueFd b = Connect(path);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  uint64_t id_a = Hello(a.get()).hello().session_id();
  uint64_t id_b = Hello(b.get()).hello().session_id();
  CHECK(id_a != id_b);
  CHECK(WaitFor([&] { return server.sessions() == 2; }));
  a.reset();  // client exit
  CHECK(WaitFor([&] { return server.sessions() == 1; }));
  server.Stop();
  CHECK(server.sessions() == 0);
  CHECK(::stat(path.c_str(), &st) != 0);  // socket file removed
}

TEST_CASE("Stop closes live sessions", "[server]") {
  ShortTempDir dir;
  std::string path = dir.path() + "/s";
  SessionServer server(Opts(path), InProcess());
  REQUIRE(server.Start().ok());
  UniqueFd a = Connect(path);
  Hello(a.get());
  server.Stop();
  std::string in;
  std::vector<int> fds;
  CHECK(wire::RecvFrame(a.get(), 1024, &in, &fds) == wire::kEof);
}

TEST_CASE("A stale socket file is replaced", "[server]") {
  ShortTempDir dir;
  std::string path = dir.path() + "/s";
  {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, path.c_str());
    REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr),
                   sizeof(addr)) == 0);
  }  // closed without unlinking: stale
  SessionServer server(Opts(path), InProcess());
  CHECK(server.Start().ok());
}

TEST_CASE("A live socket of another server is not taken over", "[server]") {
  ShortTempDir dir;
  std::string path = dir.path() + "/s";
  SessionServer first(Opts(path), InProcess());
  REQUIRE(first.Start().ok());
  SessionServer second(Opts(path), InProcess());
  absl::Status s = second.Start();
  CHECK(s.code() == absl::StatusCode::kAlreadyExists);
  CHECK(s.message() == "another daemon is already serving " + path +
                           "; stop it first or pass a different --socket");
}

TEST_CASE("A path that is not a socket is refused", "[server]") {
  ShortTempDir dir;
  std::string path = dir.path() + "/file";
  std::ofstream(path) << "x";
  SessionServer server(Opts(path), InProcess());
  absl::Status s = server.Start();
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(s.message() == "session socket path " + path +
                           " exists and is not a socket; remove it or pass a "
                           "different --socket");
}

TEST_CASE("An over-long socket path is refused", "[server]") {
  SessionServer server(Opts("/tmp/" + std::string(200, 'x')), InProcess());
  CHECK(server.Start().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("An inherited listening fd is served", "[server]") {
  ShortTempDir dir;
  std::string path = dir.path() + "/inherited";
  UniqueFd lfd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, path.c_str());
  REQUIRE(::bind(lfd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) ==
          0);
  REQUIRE(::listen(lfd.get(), 8) == 0);
  SessionOptions o;
  o.listen_fd = lfd.get();
  SessionServer server(o, InProcess());
  REQUIRE(server.Start().ok());
  UniqueFd c = Connect(path);
  CHECK(Hello(c.get()).status().code() == 0);
}

}  // namespace
}  // namespace kreg
