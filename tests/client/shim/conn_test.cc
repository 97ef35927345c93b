// The shim's session connection (client/shim/conn.cc) against a scripted
// fake kregd on a temp Unix socket: the Hello exchange, the daemon's errors
// (per request and connection-level), a peer that closes, replies too large
// or malformed, the message limit, the end of an idle session, and arena
// growth. The fake speaks session.proto over common/wire framing only.
#include "client/shim/conn.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "catch2/catch.hpp"
#include "common/session_protocol.h"
#include "common/wire.h"
#include "kreg/v1/session.pb.h"
#include "tests/client/shim/fake_kregd.h"
#include "xla/ffi/api/c_api.h"

namespace kreg::shim {
namespace {

v1::HelloReply Reply() {
  v1::HelloReply r;
  r.set_session_id(42);
  r.set_protocol_major(kSessionProtocolMajor);
  r.set_protocol_minor(kSessionProtocolMinor);
  r.set_max_arena_bytes(4u << 20);
  r.set_max_message_bytes(1u << 20);
  return r;
}

// Opens a session on `kregd`, REQUIREing success.
std::unique_ptr<Conn> OpenOk(const FakeKregd& kregd) {
  std::unique_ptr<Conn> conn;
  ClientStatus s = Conn::Open(kregd.path, &conn);
  INFO(s.message);
  REQUIRE(s.ok());
  REQUIRE(conn != nullptr);
  return conn;
}

TEST_CASE("Open says Hello and keeps what kregd answers", "[shim][conn]") {
  v1::HelloReply reply = Reply();
  reply.set_max_module_bytes(64u << 20);
  reply.set_max_cuda_mappings(16);
  reply.add_cuda_device_uuids(std::string(16, '\xa0'));
  reply.add_cuda_device_uuids(std::string(16, '\xa1'));
  reply.set_cuda_status("kregd has 2 GPUs");
  reply.set_cuda_doorbell(true);
  reply.set_launch_ring(0);  // launches on the socket
  FakeKregd kregd([&](Peer* p) { p->Hello(reply); });
  std::unique_ptr<Conn> conn = OpenOk(kregd);
  CHECK(conn->hello().session_id() == 42);
  CHECK(conn->hello().max_message_bytes() == (1u << 20));
  CHECK(conn->hello().max_module_bytes() == (64u << 20));
  CHECK(conn->hello().max_cuda_mappings() == 16);
  CHECK(conn->hello().cuda_device_uuids_size() == 2);
  CHECK(conn->hello().cuda_device_uuids(0) == std::string(16, '\xa0'));
  CHECK(conn->hello().cuda_device_uuids(1) == std::string(16, '\xa1'));
  CHECK(conn->hello().cuda_status() == "kregd has 2 GPUs");
  CHECK(conn->hello().cuda_doorbell());
  CHECK_FALSE(conn->ring());
  CHECK_FALSE(conn->broken());
  CHECK(conn->arena() == nullptr);
  conn.reset();
  kregd.Join();
  REQUIRE(kregd.requests.size() == 1);
  const v1::SessionRequest& hello = kregd.requests[0];
  CHECK(hello.id() == 1);
  CHECK(hello.hello().protocol_major() == 2);
  CHECK(hello.hello().protocol_minor() == 0);
  CHECK(hello.hello().pid() == ::getpid());
  CHECK(hello.hello().ffi_api_major() == XLA_FFI_API_MAJOR);
  CHECK(hello.hello().ffi_api_minor() == XLA_FFI_API_MINOR);
}

TEST_CASE("Open of a control connection says control_hello", "[shim][conn]") {
  v1::HelloReply reply;
  reply.set_protocol_major(kSessionProtocolMajor);
  reply.set_max_module_bytes(64u << 20);
  FakeKregd kregd([&](Peer* p) {
    v1::SessionRequest req;
    if (!p->Recv(&req)) return;
    v1::SessionResponse resp;
    resp.set_id(req.id());
    *resp.mutable_hello() = reply;
    p->Send(resp);
  });
  std::unique_ptr<Conn> conn;
  ClientStatus s = Conn::Open(kregd.path, &conn, /*control=*/true);
  REQUIRE(s.ok());
  CHECK(conn->hello().max_module_bytes() == (64u << 20));
  CHECK_FALSE(conn->ring());
  conn.reset();
  kregd.Join();
  REQUIRE(kregd.requests.size() == 1);
  const v1::SessionRequest& hello = kregd.requests[0];
  CHECK_FALSE(hello.has_hello());
  CHECK(hello.control_hello().protocol_major() == kSessionProtocolMajor);
  CHECK(hello.control_hello().pid() == ::getpid());
}

TEST_CASE("Open refuses a kregd of another major, saying who is older",
          "[shim][conn]") {
  for (uint32_t major : {1u, 3u}) {
    v1::HelloReply reply = Reply();
    reply.set_protocol_major(major);
    reply.set_protocol_minor(8);
    FakeKregd kregd([&](Peer* p) { p->Hello(reply); });
    std::unique_ptr<Conn> conn;
    ClientStatus s = Conn::Open(kregd.path, &conn);
    CHECK(s.code == kFailedPrecondition);
    CHECK(s.message ==
          "kregd at " + kregd.path +
              ": the client library speaks session protocol 2.0 and kregd " +
              std::to_string(major) + ".8: " +
              (major == 1 ? "kregd is older. Update kregd"
                          : "the client library is older. Update the client "
                            "library (the kreg wheel)") +
              " so that both are from the same release");
    CHECK(conn == nullptr);
  }
}

TEST_CASE("Open with a kregd of a later minor speaks this library's",
          "[shim][conn]") {
  v1::HelloReply reply = Reply();
  reply.set_protocol_minor(kSessionProtocolMinor + 5);
  FakeKregd kregd([&](Peer* p) { p->Hello(reply); });
  std::unique_ptr<Conn> conn = OpenOk(kregd);
  CHECK(conn->protocol_minor() == kSessionProtocolMinor);
}

TEST_CASE("Open refuses an empty or too long socket path", "[shim][conn]") {
  std::unique_ptr<Conn> conn;
  ClientStatus s = Conn::Open("", &conn);
  CHECK(s.code == kInvalidArgument);
  CHECK(s.message ==
        "kregd session socket path \"\" is empty or too long for a Unix "
        "socket");
  const std::string long_path = "/tmp/" + std::string(200, 'k');
  s = Conn::Open(long_path, &conn);
  CHECK(s.code == kInvalidArgument);
  CHECK_THAT(s.message, Catch::Contains("\"" + long_path + "\"") &&
                            Catch::Contains("too long for a Unix socket"));
  CHECK(conn == nullptr);
}

TEST_CASE("Open where nothing listens is UNAVAILABLE, with how to start kregd",
          "[shim][conn]") {
  char dir[] = "/tmp/kreg-shim-conn.XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string admin = std::string(dir) + "/kregd.sock";
  const std::string path = admin + ".session";
  std::unique_ptr<Conn> conn;
  ClientStatus s = Conn::Open(path, &conn);
  ::rmdir(dir);
  CHECK(s.code == kUnavailable);
  CHECK_THAT(s.message,
             Catch::StartsWith("cannot connect to the kregd session socket " +
                               path + ": " + std::strerror(ENOENT) +
                               " (is kregd running?)") &&
                 Catch::Contains("Start it with `kregd --socket " + admin +
                                 "` or `systemctl start kregd`"));
  CHECK(conn == nullptr);
}

TEST_CASE("Open returns kregd's refusal of the session as it is",
          "[shim][conn]") {
  FakeKregd kregd([](Peer* p) {
    v1::SessionRequest req;
    if (!p->Recv(&req)) return;
    v1::SessionResponse resp;  // id 0: connection-level
    resp.mutable_status()->set_code(kResourceExhausted);
    resp.mutable_status()->set_message("kregd serves at most 64 sessions");
    p->Send(resp);
  });
  std::unique_ptr<Conn> conn;
  ClientStatus s = Conn::Open(kregd.path, &conn);
  CHECK(s.code == kResourceExhausted);
  CHECK(s.message == "kregd serves at most 64 sessions");
  CHECK(conn == nullptr);
}

TEST_CASE("Open refuses an answer to Hello that is not a HelloReply",
          "[shim][conn]") {
  FakeKregd kregd([](Peer* p) {
    v1::SessionRequest req;
    if (!p->Recv(&req)) return;
    v1::SessionResponse resp;
    resp.set_id(req.id());
    resp.mutable_list();
    p->Send(resp);
  });
  std::unique_ptr<Conn> conn;
  ClientStatus s = Conn::Open(kregd.path, &conn);
  CHECK(s.code == kInternal);
  CHECK(s.message == "kregd answered Hello without HelloReply");
  CHECK(conn == nullptr);
}

TEST_CASE("Call returns the daemon's error as is; the session goes on",
          "[shim][conn]") {
  FakeKregd kregd([](Peer* p) {
    if (!p->Hello(Reply())) return;
    v1::SessionRequest req;
    if (!p->Recv(&req)) return;
    p->Fail(req, kNotFound, "target \"my_op\" is not registered");
    if (!p->Recv(&req)) return;
    v1::SessionResponse ok;
    ok.set_id(req.id());
    ok.mutable_list();
    p->Send(ok);
  });
  std::unique_ptr<Conn> conn = OpenOk(kregd);
  v1::SessionRequest req;
  req.mutable_list();
  v1::SessionResponse resp;
  ClientStatus s = conn->Call(&req, &resp);
  CHECK(s.code == kNotFound);
  CHECK(s.message == "target \"my_op\" is not registered");
  CHECK_FALSE(conn->broken());
  CHECK_FALSE(conn->refused());
  CHECK_FALSE(conn->ended());
  req.Clear();
  req.mutable_list();
  s = conn->Call(&req, &resp);
  CHECK(s.ok());
  CHECK(resp.has_list());
  conn.reset();
  kregd.Join();
  REQUIRE(kregd.requests.size() == 3);
  CHECK(kregd.requests[1].id() == 2);
  CHECK(kregd.requests[2].id() == 3);
}

TEST_CASE("Call: a connection-level error ends the session", "[shim][conn]") {
  FakeKregd kregd([](Peer* p) {
    if (!p->Hello(Reply())) return;
    v1::SessionRequest req;
    if (!p->Recv(&req)) return;
    v1::SessionResponse resp;  // id 0
    resp.mutable_status()->set_code(kUnavailable);
    resp.mutable_status()->set_message("the executor of this session died");
    p->Send(resp);
  });
  std::unique_ptr<Conn> conn = OpenOk(kregd);
  v1::SessionRequest req;
  req.mutable_list();
  v1::SessionResponse resp;
  ClientStatus s = conn->Call(&req, &resp);
  CHECK(s.code == kUnavailable);
  CHECK(s.message == "the executor of this session died");
  CHECK(conn->broken());
  CHECK(conn->refused());
  CHECK(conn->ended());
}

TEST_CASE("Call: a peer that closes breaks and ends the session",
          "[shim][conn]") {
  FakeKregd kregd([](Peer* p) {
    if (!p->Hello(Reply())) return;
    v1::SessionRequest req;
    p->Recv(&req);  // and closes without an answer
  });
  std::unique_ptr<Conn> conn = OpenOk(kregd);
  v1::SessionRequest req;
  req.mutable_list();
  v1::SessionResponse resp;
  ClientStatus s = conn->Call(&req, &resp);
  CHECK(s.code == kUnavailable);
  CHECK_THAT(
      s.message,
      Catch::StartsWith("kregd session " + kregd.path + ": receive failed: " +
                        wire::ResultText(wire::kEof) + " (did kregd stop?)"));
  CHECK(conn->broken());
  CHECK(conn->ended());
  CHECK_FALSE(conn->refused());
  // A broken session sends nothing more.
  s = conn->Call(&req, &resp);
  CHECK(s.code == kUnavailable);
  CHECK(s.message == "kregd session " + kregd.path + " is closed");
}

TEST_CASE("Call: a peer that closes inside a reply ends the session",
          "[shim][conn]") {
  FakeKregd kregd([](Peer* p) {
    if (!p->Hello(Reply())) return;
    v1::SessionRequest req;
    if (!p->Recv(&req)) return;
    p->Write(std::string("\x64\0\0\0", 4) + "ten bytes.");  // 100 declared
  });
  std::unique_ptr<Conn> conn = OpenOk(kregd);
  v1::SessionRequest req;
  req.mutable_list();
  v1::SessionResponse resp;
  ClientStatus s = conn->Call(&req, &resp);
  CHECK(s.code == kUnavailable);
  CHECK_THAT(s.message, Catch::Contains("receive failed: " +
                                        wire::ResultText(wire::kTruncated)));
  CHECK(conn->broken());
  CHECK(conn->ended());
}

TEST_CASE("Call: a reply declared over 256 MiB is refused unread",
          "[shim][conn]") {
  FakeKregd kregd([](Peer* p) {
    if (!p->Hello(Reply())) return;
    v1::SessionRequest req;
    if (!p->Recv(&req)) return;
    p->Write(std::string("\x01\0\0\x10", 4));  // 256 MiB + 1
  });
  std::unique_ptr<Conn> conn = OpenOk(kregd);
  v1::SessionRequest req;
  req.mutable_list();
  v1::SessionResponse resp;
  ClientStatus s = conn->Call(&req, &resp);
  CHECK(s.code == kUnavailable);
  CHECK_THAT(s.message, Catch::Contains("receive failed: " +
                                        wire::ResultText(wire::kTooLarge)));
  CHECK(conn->broken());
  // The peer did not end the session; this client gave up on it.
  CHECK_FALSE(conn->ended());
}

TEST_CASE("Call: a reply that does not parse breaks the session",
          "[shim][conn]") {
  FakeKregd kregd([](Peer* p) {
    if (!p->Hello(Reply())) return;
    v1::SessionRequest req;
    if (!p->Recv(&req)) return;
    p->SendRaw("\xff\xff\xff\xff");  // not a SessionResponse
  });
  std::unique_ptr<Conn> conn = OpenOk(kregd);
  v1::SessionRequest req;
  req.mutable_list();
  v1::SessionResponse resp;
  ClientStatus s = conn->Call(&req, &resp);
  CHECK(s.code == kInternal);
  CHECK(s.message == "kregd sent a malformed session response");
  CHECK(conn->broken());
  CHECK_FALSE(conn->ended());
}

TEST_CASE("Call: an answer to another request breaks the session",
          "[shim][conn]") {
  FakeKregd kregd([](Peer* p) {
    if (!p->Hello(Reply())) return;
    v1::SessionRequest req;
    if (!p->Recv(&req)) return;
    v1::SessionResponse resp;
    resp.set_id(7);
    p->Send(resp);
  });
  std::unique_ptr<Conn> conn = OpenOk(kregd);
  v1::SessionRequest req;
  req.mutable_list();
  v1::SessionResponse resp;
  ClientStatus s = conn->Call(&req, &resp);
  CHECK(s.code == kInternal);
  CHECK(s.message == "kregd answered request 7 instead of 2");
  CHECK(conn->broken());
}

TEST_CASE("Call refuses a request over kregd's max_message_bytes, unsent",
          "[shim][conn]") {
  v1::HelloReply reply = Reply();
  reply.set_max_message_bytes(64);
  FakeKregd kregd([&](Peer* p) {
    if (!p->Hello(reply)) return;
    v1::SessionRequest req;
    p->Recv(&req);  // only the end of the session comes
  });
  std::unique_ptr<Conn> conn = OpenOk(kregd);
  v1::SessionRequest req;
  req.mutable_launch()->set_descriptor(std::string(100, 't'));
  const size_t bytes = [&] {
    v1::SessionRequest sized = req;
    sized.set_id(2);
    return sized.ByteSizeLong();
  }();
  v1::SessionResponse resp;
  ClientStatus s = conn->Call(&req, &resp);
  CHECK(s.code == kResourceExhausted);
  CHECK(s.message == "session message of " + std::to_string(bytes) +
                         " bytes exceeds kregd's max_message_bytes (64)");
  CHECK_FALSE(conn->broken());
  CHECK_FALSE(conn->launch_sent());
  conn.reset();
  kregd.Join();
  CHECK(kregd.requests.size() == 1);  // the Hello only
}

TEST_CASE("Call hands the first fd of a reply to the caller", "[shim][conn]") {
  FakeKregd kregd([](Peer* p) {
    if (!p->Hello(Reply())) return;
    v1::SessionRequest req;
    if (!p->Recv(&req)) return;
    int fds[2];
    for (int& fd : fds) {
      fd = ::memfd_create("t", MFD_CLOEXEC);
      (void)!::write(fd, "module", 6);
    }
    v1::SessionResponse resp;
    resp.set_id(req.id());
    resp.mutable_bind_local();
    p->Send(resp, fds, 2);
    for (int fd : fds) ::close(fd);
  });
  std::unique_ptr<Conn> conn = OpenOk(kregd);
  v1::SessionRequest req;
  req.mutable_bind_local();
  v1::SessionResponse resp;
  UniqueFd received;
  ClientStatus s = conn->Call(&req, &resp, nullptr, 0, &received);
  REQUIRE(s.ok());
  REQUIRE(received.get() >= 0);
  char back[6];
  REQUIRE(::pread(received.get(), back, 6, 0) == 6);
  CHECK(std::string(back, 6) == "module");
}

TEST_CASE("ReadEnd returns kregd's connection-level error", "[shim][conn]") {
  FakeKregd kregd([](Peer* p) {
    if (!p->Hello(Reply())) return;
    v1::SessionResponse resp;  // id 0, unsolicited
    resp.mutable_status()->set_code(kAborted);
    resp.mutable_status()->set_message("executor 3 crashed");
    p->Send(resp);
  });
  std::unique_ptr<Conn> conn = OpenOk(kregd);
  ClientStatus s = conn->ReadEnd();
  CHECK(s.code == kAborted);
  CHECK(s.message == "executor 3 crashed");
  CHECK(conn->broken());
  CHECK(conn->refused());
  CHECK(conn->ended());
}

TEST_CASE("ReadEnd of a session whose socket closed", "[shim][conn]") {
  FakeKregd kregd([](Peer* p) { p->Hello(Reply()); });
  std::unique_ptr<Conn> conn = OpenOk(kregd);
  kregd.Join();  // the fake has closed the session
  ClientStatus s = conn->ReadEnd();
  CHECK(s.code == kUnavailable);
  CHECK(s.message == "kregd ended session 42 (" + wire::ResultText(wire::kEof) +
                         "): its executor went away");
  CHECK(conn->broken());
  CHECK(conn->ended());
  CHECK_FALSE(conn->refused());
}

TEST_CASE("ReadEnd refuses a response that is not a connection-level error",
          "[shim][conn]") {
  FakeKregd kregd([](Peer* p) {
    if (!p->Hello(Reply())) return;
    v1::SessionResponse resp;
    resp.set_id(5);
    p->Send(resp);
  });
  std::unique_ptr<Conn> conn = OpenOk(kregd);
  ClientStatus s = conn->ReadEnd();
  CHECK(s.code == kInternal);
  CHECK(s.message ==
        "kregd sent an unexpected session response to an idle session");
  CHECK(conn->broken());
  CHECK_FALSE(conn->refused());
}

TEST_CASE("EnsureArena hands kregd a sealed memfd of at least 1 MiB",
          "[shim][conn]") {
  FakeKregd kregd([](Peer* p) {
    if (!p->Hello(Reply())) return;
    v1::SessionRequest req;
    if (!p->Recv(&req)) return;
    v1::SessionResponse resp;
    resp.set_id(req.id());
    resp.mutable_arena_grow()->set_size(req.arena_grow().size());
    p->Send(resp);
  });
  std::unique_ptr<Conn> conn = OpenOk(kregd);
  REQUIRE(conn->EnsureArena(1000).ok());
  CHECK(conn->arena_size() == (1u << 20));
  REQUIRE(conn->arena() != nullptr);
  conn->arena()[(1u << 20) - 1] = 'k';  // mapped, writable
  // Already large enough: nothing is sent.
  REQUIRE(conn->EnsureArena(4096).ok());
  conn.reset();
  kregd.Join();
  REQUIRE(kregd.requests.size() == 2);
  CHECK(kregd.requests[1].arena_grow().size() == (1u << 20));
  REQUIRE(kregd.fd_sizes.size() == 1);
  CHECK(kregd.fd_sizes[0] == (1 << 20));
  const int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  CHECK((kregd.fd_seals[0] & seals) == seals);
}

TEST_CASE("EnsureArena refuses more than kregd's max_arena_bytes, unsent",
          "[shim][conn]") {
  FakeKregd kregd([](Peer* p) {
    if (!p->Hello(Reply())) return;
    v1::SessionRequest req;
    p->Recv(&req);
  });
  std::unique_ptr<Conn> conn = OpenOk(kregd);
  ClientStatus s = conn->EnsureArena(9000000);
  CHECK(s.code == kResourceExhausted);
  CHECK(s.message ==
        "this call needs 9000000 bytes of session shared memory; kregd "
        "allows at most 4194304 (max_arena_bytes)");
  CHECK(conn->arena() == nullptr);
  CHECK_FALSE(conn->broken());
  conn.reset();
  kregd.Join();
  CHECK(kregd.requests.size() == 1);
}

TEST_CASE("EnsureArena keeps the old arena when kregd refuses the new one",
          "[shim][conn]") {
  FakeKregd kregd([](Peer* p) {
    if (!p->Hello(Reply())) return;
    v1::SessionRequest req;
    if (!p->Recv(&req)) return;
    p->Fail(req, kResourceExhausted, "arena of 1048576 bytes over budget");
  });
  std::unique_ptr<Conn> conn = OpenOk(kregd);
  ClientStatus s = conn->EnsureArena(1000);
  CHECK(s.code == kResourceExhausted);
  CHECK(s.message == "arena of 1048576 bytes over budget");
  CHECK(conn->arena() == nullptr);
  CHECK(conn->arena_size() == 0);
  CHECK_FALSE(conn->broken());
}

}  // namespace
}  // namespace kreg::shim
