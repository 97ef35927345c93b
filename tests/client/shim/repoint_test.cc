// Re-pointing local bindings in the shim (docs/replace.md section 4): the
// re-pointable entries (forward.cc) and the watch connection's intake
// (ServeRepoints, ApplyRepoint) against a fake kregd on a socketpair.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "client/shim/forward.h"
#include "client/shim/local_bind.h"
#include "client/shim/repoint_watch.h"
#include "common/sha256.h"
#include "common/wire.h"
#include "tests/testing/socket_pair.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace shim {
namespace {

char g_called = 0;
XLA_FFI_Error* First(XLA_FFI_CallFrame*) {
  g_called = '1';
  return nullptr;
}
XLA_FFI_Error* Second(XLA_FFI_CallFrame*) {
  g_called = '2';
  return nullptr;
}

void Call(void* entry) {
  XLA_FFI_CallFrame frame{};
  reinterpret_cast<XLA_FFI_Handler*>(entry)(&frame);
}

// Runs first: the slots the next case counts on are all free but one.
TEST_CASE("A re-pointable entry calls its slot's handler until it moves",
          "[shim][repoint]") {
  int slot = -1;
  void* entry = nullptr;
  REQUIRE(BindRepointable("demo.r", "cpu", reinterpret_cast<void*>(&First),
                          &slot, &entry)
              .ok());
  CHECK(slot == 0);
  CHECK(entry != reinterpret_cast<void*>(&First));
  Call(entry);
  CHECK(g_called == '1');
  SetRepointable(slot, reinterpret_cast<void*>(&Second));
  Call(entry);
  CHECK(g_called == '2');
}

TEST_CASE("The re-pointable entries are bounded, with a clear error",
          "[shim][repoint]") {
  int slot = -1;
  void* entry = nullptr;
  for (int i = 1; i < kNumRepointSlots; ++i) {
    REQUIRE(BindRepointable("demo.r" + std::to_string(i), "cpu",
                            reinterpret_cast<void*>(&First), &slot, &entry)
                .ok());
  }
  CHECK(slot == kNumRepointSlots - 1);
  ClientStatus s = BindRepointable(
      "demo.full", "cpu", reinterpret_cast<void*>(&First), &slot, &entry);
  CHECK(s.code == kResourceExhausted);
  CHECK(s.message ==
        "cannot bind \"demo.full\" (cpu) locally: all 256 re-pointable "
        "entries of this process are in use (one per replaceable target "
        "bound locally); run it isolated (execution=\"isolated\") or in "
        "another process");
}

UniqueFd Memfd(const std::string& bytes, bool sealed) {
  UniqueFd fd(::memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  REQUIRE(fd.ok());
  REQUIRE(::write(fd.get(), bytes.data(), bytes.size()) ==
          static_cast<ssize_t>(bytes.size()));
  if (sealed) {
    REQUIRE(::fcntl(fd.get(), F_ADD_SEALS,
                    F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) ==
            0);
  }
  return fd;
}

// kregd's end of a watch connection, with the shim's ServeRepoints running
// on the other.
struct FakeKregd {
  FakeKregd() {
    shim = std::thread(
        [this] { ended = ServeRepoints(theirs.get(), ApplyRepoint); });
  }
  ~FakeKregd() {
    mine.reset();
    shim.join();
  }
  void Send(const v1::SessionResponse& r, int fd) {
    std::string out;
    r.SerializeToString(&out);
    REQUIRE(wire::SendFrame(mine.get(), out.data(), out.size(), &fd,
                            fd >= 0 ? 1 : 0) == wire::kOk);
  }
  v1::RepointAck NextAck() {
    std::string payload;
    std::vector<int> fds;
    REQUIRE(wire::RecvFrame(mine.get(), 1 << 16, &payload, &fds) == wire::kOk);
    CHECK(fds.empty());
    v1::SessionRequest req;
    REQUIRE(req.ParseFromString(payload));
    REQUIRE(req.has_repoint_ack());
    return req.repoint_ack();
  }
  kreg::testing::SocketPair sockets;
  UniqueFd& mine = sockets.a;
  UniqueFd& theirs = sockets.b;
  std::thread shim;
  ClientStatus ended;
};

v1::SessionResponse Notice(const std::string& bytes) {
  v1::SessionResponse r;
  v1::Repoint* n = r.mutable_repoint();
  n->set_target_name("demo.r");
  n->set_platform("cpu");
  n->set_generation(2);
  n->set_module_digest(Sha256Hex(bytes.data(), bytes.size()));
  n->set_module_size(bytes.size());
  n->set_func_name("Version");
  return r;
}

TEST_CASE("A notice the shim cannot apply is acked with the reason",
          "[shim][repoint]") {
  const std::string bytes = "the new module's bytes";
  v1::SessionResponse notice = Notice(bytes);
  int code = 0;
  std::string message;
  {
    FakeKregd kregd;
    SECTION("an unsealed memfd") {
      kregd.Send(notice, Memfd(bytes, false).get());
      code = kFailedPrecondition;
      message =
          "kreg: the module kregd handed out for \"demo.r\" (cpu) is not "
          "sealed against changes (seals 0), so it could change after the "
          "check; nothing was loaded";
    }
    SECTION("a memfd of another size") {
      notice.mutable_repoint()->set_module_size(bytes.size() + 1);
      kregd.Send(notice, Memfd(bytes, true).get());
      code = kDataLoss;
      message =
          "kreg: the module kregd handed out for \"demo.r\" (cpu) has 22 "
          "bytes, not the registered 23; nothing was loaded";
    }
    SECTION("other bytes than the digest says") {
      std::string other = bytes;
      other[0] = 'T';
      kregd.Send(notice, Memfd(other, true).get());
      code = kDataLoss;
      message =
          "kreg: the module kregd handed out for \"demo.r\" (cpu) has "
          "digest " +
          Sha256Hex(other.data(), other.size()) + ", not the registered " +
          notice.repoint().module_digest() +
          "; it was not loaded. kregd's store copy may be corrupt: see "
          "`kregctl show demo.r` and kregd's log";
    }
    SECTION("a target this process has not bound locally") {
      kregd.Send(notice, Memfd(bytes, true).get());
      code = kNotFound;
      message =
          "kreg: this process has no local binding of \"demo.r\" (cpu) to "
          "move to generation 2";
    }
    SECTION("no memfd") {
      kregd.Send(notice, -1);
      code = kInvalidArgument;
      message =
          "kreg: kregd's notice moving \"demo.r\" to generation 2 came with 0 "
          "file descriptors, not the module's one; nothing was loaded";
    }
    v1::RepointAck ack = kregd.NextAck();
    CHECK(ack.target_name() == "demo.r");
    CHECK(ack.platform() == "cpu");
    CHECK(ack.generation() == 2);
    CHECK(ack.status().code() == code);
    CHECK(ack.status().message() == message);
  }
}

TEST_CASE("The watch ends on kregd's error, a frame that is no notice, or EOF",
          "[shim][repoint]") {
  ClientStatus ended;
  SECTION("kregd's connection-level error") {
    FakeKregd kregd;
    v1::SessionResponse error;
    error.mutable_status()->set_code(kResourceExhausted);
    error.mutable_status()->set_message("too slow");
    kregd.Send(error, -1);
    kregd.shim.join();
    CHECK(kregd.ended.code == kResourceExhausted);
    CHECK(kregd.ended.message ==
          "kreg: kregd ended the watch connection: too slow");
    kregd.shim = std::thread([] {});
  }
  SECTION("a frame that does not parse") {
    FakeKregd kregd;
    REQUIRE(wire::SendFrame(kregd.mine.get(), "\xff\xff", 2, nullptr, 0) ==
            wire::kOk);
    kregd.shim.join();
    CHECK(kregd.ended.code == kInternal);
    CHECK(kregd.ended.message ==
          "kreg: kregd sent a malformed frame on the watch connection (2 "
          "bytes)");
    kregd.shim = std::thread([] {});
  }
  SECTION("kregd closed it") {
    FakeKregd kregd;
    kregd.mine.reset();
    kregd.shim.join();
    CHECK(kregd.ended.code == kUnavailable);
    CHECK_THAT(kregd.ended.message,
               Catch::StartsWith("kreg: the watch connection to kregd "
                                 "ended: "));
    kregd.shim = std::thread([] {});
  }
}

}  // namespace
}  // namespace shim
}  // namespace kreg
