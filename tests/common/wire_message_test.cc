// wire::SendMessage and RecvMessage (common/wire.h) over a socket pair,
// with kreg.v1 messages.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "catch2/catch.hpp"
#include "common/unique_fd.h"
#include "common/wire.h"
#include "kreg/v1/session.pb.h"
#include "tests/testing/socket_pair.h"

namespace kreg {
namespace {

using Pair = testing::SocketPair;

TEST_CASE("A message round-trips and attached descriptors are closed",
          "[wire]") {
  Pair p;
  int pipefd[2];
  REQUIRE(::pipe(pipefd) == 0);
  UniqueFd r(pipefd[0]), w(pipefd[1]);
  v1::SessionResponse sent;
  sent.set_id(7);
  sent.mutable_status()->set_message("hello");
  const int fds[1] = {w.get()};
  const wire::Clock::time_point deadline =
      wire::Clock::now() + std::chrono::seconds(10);
  REQUIRE(wire::SendMessage(p.a.get(), sent, fds, 1, &deadline) == wire::kOk);
  w.reset();  // the received copy is the write end's last holder
  v1::SessionResponse got;
  REQUIRE(wire::RecvMessage(p.b.get(), 1024, &got) == wire::kOk);
  CHECK(got.id() == 7);
  CHECK(got.status().message() == "hello");
  // RecvMessage closed the write end it received: the pipe reads EOF.
  char c;
  CHECK(::read(r.get(), &c, 1) == 0);
}

TEST_CASE("RecvMessage: a frame that is not the message is kMalformed",
          "[wire]") {
  Pair p;
  const std::string junk = "\xff\xff\xff";
  REQUIRE(wire::SendFrame(p.a.get(), junk.data(), junk.size(), nullptr, 0) ==
          wire::kOk);
  v1::SessionResponse got;
  CHECK(wire::RecvMessage(p.b.get(), 1024, &got) == wire::kMalformed);
  CHECK(wire::ResultText(wire::kMalformed) == "the message does not parse");
}

TEST_CASE("RecvMessage passes the frame's errors through", "[wire]") {
  Pair p;
  v1::SessionResponse big;
  big.mutable_status()->set_message(std::string(100, 'x'));
  REQUIRE(wire::SendMessage(p.a.get(), big) == wire::kOk);
  v1::SessionResponse got;
  CHECK(wire::RecvMessage(p.b.get(), 16, &got) == wire::kTooLarge);
  Pair q;
  q.a.reset();
  CHECK(wire::RecvMessage(q.b.get(), 1024, &got) == wire::kEof);
}

}  // namespace
}  // namespace kreg
