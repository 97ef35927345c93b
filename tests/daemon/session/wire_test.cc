#include "daemon/session/wire.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "daemon/unique_fd.h"

namespace kreg {
namespace {

struct Pair {
  Pair() {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    a.reset(sv[0]);
    b.reset(sv[1]);
  }
  UniqueFd a, b;
};

TEST_CASE("Frames round-trip, with descriptors", "[wire]") {
  Pair p;
  int pipefd[2];
  REQUIRE(::pipe(pipefd) == 0);
  std::string payload = "hello";
  REQUIRE(wire::SendFrame(p.a.get(), payload.data(), payload.size(), pipefd,
                          2) == wire::kOk);
  std::string got;
  std::vector<int> fds;
  REQUIRE(wire::RecvFrame(p.b.get(), 1024, &got, &fds) == wire::kOk);
  CHECK(got == "hello");
  REQUIRE(fds.size() == 2);
  struct stat st;
  CHECK(::fstat(fds[0], &st) == 0);
  CHECK(S_ISFIFO(st.st_mode));
  for (int fd : fds) ::close(fd);
  ::close(pipefd[0]);
  ::close(pipefd[1]);
}

TEST_CASE("Empty and large frames round-trip", "[wire]") {
  Pair p;
  std::string big(8 << 20, 'x');
  std::thread sender([&] {
    CHECK(wire::SendFrame(p.a.get(), "", 0, nullptr, 0) == wire::kOk);
    CHECK(wire::SendFrame(p.a.get(), big.data(), big.size(), nullptr, 0) ==
          wire::kOk);
  });
  std::string got;
  std::vector<int> fds;
  REQUIRE(wire::RecvFrame(p.b.get(), 16 << 20, &got, &fds) == wire::kOk);
  CHECK(got.empty());
  REQUIRE(wire::RecvFrame(p.b.get(), 16 << 20, &got, &fds) == wire::kOk);
  CHECK(got == big);
  sender.join();
}

TEST_CASE("A frame above the limit is refused", "[wire]") {
  Pair p;
  std::string payload(100, 'x');
  REQUIRE(wire::SendFrame(p.a.get(), payload.data(), payload.size(), nullptr,
                          0) == wire::kOk);
  std::string got;
  std::vector<int> fds;
  CHECK(wire::RecvFrame(p.b.get(), 99, &got, &fds) == wire::kTooLarge);
  CHECK(wire::ResultText(wire::kTooLarge) == "message larger than the limit");
}

TEST_CASE("Too many descriptors are closed and refused", "[wire]") {
  Pair p;
  REQUIRE(wire::SendFrame(p.a.get(), "x", 1, nullptr,
                          wire::kMaxFdsPerFrame + 1) == EINVAL);
}

TEST_CASE("Peer close: EOF between frames, truncation inside", "[wire]") {
  std::string got;
  std::vector<int> fds;
  {
    Pair p;
    p.a.reset();
    CHECK(wire::RecvFrame(p.b.get(), 1024, &got, &fds) == wire::kEof);
  }
  {
    Pair p;
    unsigned char header[6] = {10, 0, 0, 0, 'a', 'b'};  // 10 announced, 2 sent
    REQUIRE(::write(p.a.get(), header, sizeof(header)) == 6);
    p.a.reset();
    CHECK(wire::RecvFrame(p.b.get(), 1024, &got, &fds) == wire::kTruncated);
  }
  {
    Pair p;
    unsigned char header[2] = {10, 0};  // half a header
    REQUIRE(::write(p.a.get(), header, sizeof(header)) == 2);
    p.a.reset();
    CHECK(wire::RecvFrame(p.b.get(), 1024, &got, &fds) == wire::kTruncated);
  }
}

TEST_CASE("Sending to a closed peer fails without SIGPIPE", "[wire]") {
  Pair p;
  p.b.reset();
  CHECK(wire::SendFrame(p.a.get(), "x", 1, nullptr, 0) == EPIPE);
}

}  // namespace
}  // namespace kreg
