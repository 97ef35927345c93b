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

namespace kreg {
namespace {

// A connection that says what it is with its first byte: 'S' (a session:
// IsASession, whose refusal it sends back as "!") or 'C' (not a session);
// then it holds until the client closes.
class Classified : public ServedSession {
 public:
  Classified(uint64_t id, UniqueFd sock, const PeerCred& peer,
             SessionServer** server)
      : id_(id), sock_(std::move(sock)), peer_(peer), server_(server) {}
  void Run() override {
    char c = 0;
    if (::recv(sock_.get(), &c, 1, 0) != 1) return;
    char reply = '+';
    if (c == 'S') {
      if (!(*server_)->IsASession(id_).ok()) reply = '!';
    } else {
      (*server_)->NotASession(id_);
    }
    if (::send(sock_.get(), &reply, 1, MSG_NOSIGNAL) != 1) return;
    while (::recv(sock_.get(), &c, 1, 0) > 0) {
    }
  }
  void Shutdown() override { ::shutdown(sock_.get(), SHUT_RDWR); }
  uint64_t id() const override { return id_; }
  const PeerCred& peer() const override { return peer_; }

 private:
  const uint64_t id_;
  UniqueFd sock_;
  const PeerCred peer_;
  SessionServer** server_;
};

char Say(int fd, char what) {
  REQUIRE(::send(fd, &what, 1, MSG_NOSIGNAL) == 1);
  char reply = 0;
  REQUIRE(::recv(fd, &reply, 1, 0) == 1);
  return reply;
}

TEST_CASE(
    "With classify, a connection is pending until it says what it is, then "
    "a session of its uid or nothing the server counts",
    "[server]") {
  ShortTempDir dir;
  std::string path = dir.path() + "/s";
  UidLimits limits{};
  limits[static_cast<size_t>(UidResource::kSessions)] = 1;
  limits[static_cast<size_t>(UidResource::kPendingConnections)] = 2;
  UidAccount account(limits);
  SessionOptions o = Opts(path);
  o.account = &account;
  o.classify = true;
  SessionServer* self = nullptr;
  SessionServer server(
      o, [&self](uint64_t id, UniqueFd sock, const PeerCred& peer) {
        return std::make_shared<Classified>(id, std::move(sock), peer, &self);
      });
  self = &server;
  REQUIRE(server.Start().ok());
  const uid_t uid = ::getuid();
  auto held = [&](UidResource r) { return account.Held(uid, r); };

  UniqueFd a = Connect(path);
  UniqueFd b = Connect(path);
  CHECK(WaitFor([&] { return held(UidResource::kPendingConnections) == 2; }));
  CHECK(held(UidResource::kSessions) == 0);
  // A third waiting connection is over the uid's pending limit: refused
  // with the account's message, before a thread serves it.
  UniqueFd c = Connect(path);
  std::string in;
  std::vector<int> fds;
  REQUIRE(wire::RecvFrame(c.get(), 1 << 20, &in, &fds) == 0);
  v1::SessionResponse resp;
  REQUIRE(resp.ParseFromString(in));
  CHECK(resp.status().code() ==
        static_cast<int>(absl::StatusCode::kResourceExhausted));
  CHECK_THAT(resp.status().message(),
             Catch::Contains("connections waiting for their first request") &&
                 Catch::Contains("(max_pending_connections_per_uid)"));
  // 'S': a session (its pending connection given back).
  CHECK(Say(a.get(), 'S') == '+');
  CHECK(held(UidResource::kSessions) == 1);
  CHECK(held(UidResource::kPendingConnections) == 1);
  CHECK(server.sessions() == 2);
  // 'C': counted nowhere by the server.
  CHECK(Say(b.get(), 'C') == '+');
  CHECK(held(UidResource::kPendingConnections) == 0);
  CHECK(server.sessions() == 1);
  // A second session of the uid is over max_sessions_per_uid (1).
  UniqueFd d = Connect(path);
  CHECK(Say(d.get(), 'S') == '!');
  d.reset();
  a.reset();
  CHECK(WaitFor([&] { return held(UidResource::kSessions) == 0; }));
  server.Stop();
  CHECK(server.sessions() == 0);
  CHECK(held(UidResource::kPendingConnections) == 0);
}

}  // namespace
}  // namespace kreg
