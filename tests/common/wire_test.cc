#include "common/wire.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "catch2/catch.hpp"
#include "common/unique_fd.h"
#include "tests/testing/socket_pair.h"

namespace kreg {
namespace {

using Pair = testing::SocketPair;

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
  // The sender keeps its results for the main thread to check: Catch2's
  // assertion macros are not thread-safe.
  int sent_empty = -1, sent_big = -1;
  std::thread sender([&] {
    sent_empty = wire::SendFrame(p.a.get(), "", 0, nullptr, 0);
    sent_big = wire::SendFrame(p.a.get(), big.data(), big.size(), nullptr, 0);
  });
  std::string got;
  std::vector<int> fds;
  int got_empty = wire::RecvFrame(p.b.get(), 16 << 20, &got, &fds);
  bool empty = got.empty();
  int got_big = got_empty == wire::kOk
                    ? wire::RecvFrame(p.b.get(), 16 << 20, &got, &fds)
                    : got_empty;
  if (got_big != wire::kOk) ::shutdown(p.b.get(), SHUT_RDWR);  // frees sender
  sender.join();
  CHECK(sent_empty == wire::kOk);
  CHECK(sent_big == wire::kOk);
  REQUIRE(got_empty == wire::kOk);
  CHECK(empty);
  REQUIRE(got_big == wire::kOk);
  CHECK(got == big);
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

TEST_CASE("A byte budget never goes past its limit", "[wire]") {
  wire::ByteBudget budget(100);
  CHECK(budget.TryTake(60));
  CHECK_FALSE(budget.TryTake(41));
  CHECK(budget.used() == 60);
  CHECK(budget.TryTake(40));
  CHECK_FALSE(budget.TryTake(1));
  budget.Give(100);
  CHECK(budget.used() == 0);
  CHECK_FALSE(budget.TryTake(101));
  CHECK_FALSE(budget.TryTake(UINT64_MAX));  // no overflow
  CHECK(budget.used() == 0);
}

TEST_CASE("Receive buffers take their growth from a shared budget", "[wire]") {
  Pair p1, p2;
  wire::ByteBudget budget(3 << 20);
  wire::RecvBuffer one(&budget), two(&budget);
  std::string big(2 << 20, 'x');
  int sent = -1;  // checked here: Catch2 assertions are not thread-safe
  std::thread sender([&] {
    sent = wire::SendFrame(p1.a.get(), big.data(), big.size(), nullptr, 0);
  });
  std::vector<int> fds;
  int received = wire::RecvFrame(p1.b.get(), 16 << 20, &one, &fds);
  if (received != wire::kOk) p1.b.reset();  // frees the sender
  sender.join();
  CHECK(sent == wire::kOk);
  REQUIRE(received == wire::kOk);
  CHECK(one.payload() == big);
  CHECK(one.held() >= big.size());
  CHECK(budget.used() == one.held());
  // The second connection's 2 MiB frame does not fit beside the first.
  std::thread sender2(
      [&] { wire::SendFrame(p2.a.get(), big.data(), big.size(), nullptr, 0); });
  CHECK(wire::RecvFrame(p2.b.get(), 16 << 20, &two, &fds) == wire::kOverBudget);
  CHECK(budget.used() <= budget.limit());
  CHECK(wire::ResultText(wire::kOverBudget) ==
        "the receive buffers of this process's sessions are full");
  // Once the first buffer is given back, the budget is free again.
  one.Shrink(1 << 20);
  CHECK(one.held() == 0);
  two.Release();
  CHECK(budget.used() == 0);
  p2.b.reset();  // the blocked sender gets EPIPE
  sender2.join();
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

// A 4-byte header announcing `len`, then `body`.
std::string Announce(uint32_t len, const std::string& body) {
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i)
    out[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  return out + body;
}

TEST_CASE("Announcing a huge frame allocates nothing until bytes arrive",
          "[wire]") {
  Pair p;
  std::string bytes = Announce(64u << 20, "0123456789");
  REQUIRE(::write(p.a.get(), bytes.data(), bytes.size()) ==
          static_cast<ssize_t>(bytes.size()));
  p.a.reset();
  std::string got;
  std::vector<int> fds;
  CHECK(wire::RecvFrame(p.b.get(), 128u << 20, &got, &fds) == wire::kTruncated);
  CHECK(got == "0123456789");
  // Not 64 MiB: the buffer is sized by what arrived (its first 64 KiB step).
  CHECK(got.capacity() <= (64u << 10) + 64);
}

TEST_CASE("A deadline covers every byte of a frame", "[wire]") {
  Pair p;
  wire::RecvBuffer buffer;
  std::vector<int> fds;
  using std::chrono::milliseconds;
  SECTION("half a header") { REQUIRE(::write(p.a.get(), "\x05\x00", 2) == 2); }
  SECTION("a header and part of the payload") {
    std::string bytes = Announce(100, "0123456789");
    REQUIRE(::write(p.a.get(), bytes.data(), bytes.size()) ==
            static_cast<ssize_t>(bytes.size()));
  }
  SECTION("nothing") {}
  const auto start = wire::Clock::now();
  CHECK(wire::RecvFrame(p.b.get(), 1 << 20, &buffer, &fds,
                        start + milliseconds(200)) == wire::kTimedOut);
  const auto took = wire::Clock::now() - start;
  CHECK(took >= milliseconds(190));
  CHECK(took < milliseconds(2000));
  CHECK(fds.empty());
  CHECK(wire::ResultText(wire::kTimedOut) ==
        "the message did not arrive in time");
}

TEST_CASE("A send with a deadline gives up on a peer that stopped reading",
          "[wire]") {
  Pair p;
  const std::string big(1 << 20, 'x');  // more than the socket buffers
  CHECK(wire::SendFrame(p.a.get(), big.data(), big.size(), nullptr, 0,
                        wire::Clock::now() + std::chrono::milliseconds(100)) ==
        wire::kTimedOut);
  // A reader takes one whole frame before the deadline.
  Pair q;
  std::string got;
  std::vector<int> fds;
  std::thread reader([&] { wire::RecvFrame(q.b.get(), 2 << 20, &got, &fds); });
  CHECK(wire::SendFrame(q.a.get(), big.data(), big.size(), nullptr, 0,
                        wire::Clock::now() + std::chrono::seconds(60)) ==
        wire::kOk);
  reader.join();
  CHECK(got == big);
}

TEST_CASE("A frame that arrives before its deadline is received", "[wire]") {
  Pair p;
  std::string bytes = Announce(5, "hello");
  ssize_t first = -1, rest = -1;  // checked here: Catch2 is not thread-safe
  std::thread sender([&] {
    first = ::write(p.a.get(), bytes.data(), 3);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    rest = ::write(p.a.get(), bytes.data() + 3, bytes.size() - 3);
  });
  wire::RecvBuffer buffer;
  std::vector<int> fds;
  int received = wire::RecvFrame(p.b.get(), 1 << 20, &buffer, &fds,
                                 wire::Clock::now() + std::chrono::seconds(5));
  sender.join();
  CHECK(first == 3);
  CHECK(rest == static_cast<ssize_t>(bytes.size() - 3));
  CHECK(received == wire::kOk);
  CHECK(buffer.payload() == "hello");
}

TEST_CASE("A frame's buffer grows with the bytes that arrive", "[wire]") {
  Pair p;
  const size_t kSize = (3u << 20) + 12345;
  std::string big(kSize, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7);
  std::string bytes = Announce(kSize, big);
  bool write_failed = false;  // checked here: Catch2 is not thread-safe
  std::thread sender([&] {
    // Trickle in uneven pieces, so the receiver sees many short reads.
    size_t pos = 0, step = 1000;
    while (pos < bytes.size()) {
      size_t n = std::min(step, bytes.size() - pos);
      ssize_t w = ::write(p.a.get(), bytes.data() + pos, n);
      if (w <= 0) {
        write_failed = true;
        break;
      }
      pos += static_cast<size_t>(w);
      step = step * 3 % 200003 + 1;
    }
  });
  std::string got;
  std::vector<int> fds;
  int received = wire::RecvFrame(p.b.get(), 16u << 20, &got, &fds);
  if (received != wire::kOk) p.b.reset();  // frees the sender
  sender.join();
  CHECK_FALSE(write_failed);
  REQUIRE(received == wire::kOk);
  CHECK(got.size() == kSize);
  CHECK(got == big);
  // Doubling from 64 KiB: never more than twice the frame.
  CHECK(got.capacity() < 2 * kSize);
}

TEST_CASE("Frames at the growth steps round-trip; a big buffer is released",
          "[wire]") {
  Pair p;
  std::string got;
  std::vector<int> fds;
  for (size_t size : {size_t{1}, size_t{65535}, size_t{65536}, size_t{65537},
                      size_t{131073}, size_t{5u << 20}, size_t{3}}) {
    INFO(size);
    std::string payload(size, static_cast<char>('a' + size % 26));
    int sent = -1;  // checked here: Catch2 assertions are not thread-safe
    std::thread sender([&] {
      sent = wire::SendFrame(p.a.get(), payload.data(), payload.size(), nullptr,
                             0);
    });
    int received = wire::RecvFrame(p.b.get(), 8u << 20, &got, &fds);
    if (received != wire::kOk) p.b.reset();  // frees the sender
    sender.join();
    CHECK(sent == wire::kOk);
    REQUIRE(received == wire::kOk);
    CHECK(got == payload);
  }
  // The 5 MiB buffer was not kept for the 3-byte frame that followed it.
  CHECK(got.capacity() < (4u << 20));
}

TEST_CASE("Sending to a closed peer fails without SIGPIPE", "[wire]") {
  Pair p;
  p.b.reset();
  CHECK(wire::SendFrame(p.a.get(), "x", 1, nullptr, 0) == EPIPE);
}

TEST_CASE("BudgetHold takes, gives back and moves what it holds",
          "[wire][budget]") {
  wire::ByteBudget budget(100);
  {
    wire::BudgetHold a(&budget);
    CHECK(a.Set(60));
    CHECK(budget.used() == 60);
    wire::BudgetHold b(&budget);
    CHECK_FALSE(b.Set(41));  // unchanged when the budget cannot cover it
    CHECK(b.held() == 0);
    CHECK(budget.used() == 60);
    CHECK(b.Set(40));
    CHECK(a.Set(10));  // lower: the difference goes back
    CHECK(budget.used() == 50);
    wire::BudgetHold c(std::move(a));
    CHECK(a.held() == 0);
    CHECK(c.held() == 10);
    b = std::move(c);  // b's 40 go back, it holds c's 10
    CHECK(budget.used() == 10);
  }
  CHECK(budget.used() == 0);
  wire::BudgetHold unbounded;
  CHECK(unbounded.Set(uint64_t{1} << 40));
  CHECK(wire::OverBudgetText(budget, 7, "x") ==
        "x needs 7 bytes, but the receive buffers and launch caches of this "
        "executor's sessions already hold 0 of their limit of 100 bytes "
        "(max_buffered_bytes); use fewer distinct large attributes at once, "
        "end idle sessions, or ask the operator to raise max_buffered_bytes");
}

TEST_CASE("TryPeekFrame looks once and leaves the frame in place", "[wire]") {
  Pair p;
  std::string got;
  bool has_fds = true, partial = true;
  // Nothing there yet.
  CHECK(wire::TryPeekFrame(p.b.get(), 1024, &got, &has_fds, &partial) ==
        wire::kWouldBlock);
  CHECK_FALSE(partial);
  CHECK_FALSE(has_fds);
  // Part of a frame: two header bytes, then the header and half the body.
  const std::string frame = std::string("\x05\0\0\0", 4) + "hello";
  REQUIRE(::write(p.a.get(), frame.data(), 2) == 2);
  CHECK(wire::TryPeekFrame(p.b.get(), 1024, &got, &has_fds, &partial) ==
        wire::kWouldBlock);
  CHECK(partial);
  REQUIRE(::write(p.a.get(), frame.data() + 2, 5) == 5);
  CHECK(wire::TryPeekFrame(p.b.get(), 1024, &got, &has_fds, &partial) ==
        wire::kWouldBlock);
  CHECK(partial);
  REQUIRE(::write(p.a.get(), frame.data() + 7, 2) == 2);
  REQUIRE(wire::TryPeekFrame(p.b.get(), 1024, &got, &has_fds, &partial) ==
          wire::kOk);
  CHECK(got == "hello");
  CHECK_FALSE(has_fds);
  // Still there for the reader.
  std::string read;
  std::vector<int> fds;
  REQUIRE(wire::RecvFrame(p.b.get(), 1024, &read, &fds) == wire::kOk);
  CHECK(read == "hello");
}

TEST_CASE("TryPeekFrame: descriptors, limits and a closed peer", "[wire]") {
  std::string got;
  bool has_fds = false, partial = false;
  {
    Pair p;
    int pipefd[2];
    REQUIRE(::pipe(pipefd) == 0);
    REQUIRE(wire::SendFrame(p.a.get(), "x", 1, pipefd, 1) == wire::kOk);
    CHECK(wire::TryPeekFrame(p.b.get(), 1024, &got, &has_fds, &partial) ==
          wire::kOk);
    CHECK(has_fds);
    std::vector<int> fds;
    REQUIRE(wire::RecvFrame(p.b.get(), 1024, &got, &fds) == wire::kOk);
    CHECK(fds.size() == 1);
    for (int fd : fds) ::close(fd);
    ::close(pipefd[0]);
    ::close(pipefd[1]);
  }
  {
    Pair p;
    REQUIRE(wire::SendFrame(p.a.get(), std::string(100, 'a').data(), 100,
                            nullptr, 0) == wire::kOk);
    CHECK(wire::TryPeekFrame(p.b.get(), 99, &got, &has_fds, &partial) ==
          wire::kTooLarge);
  }
  {
    Pair p;
    REQUIRE(::write(p.a.get(), "\x05\0\0\0he", 6) == 6);
    p.a.reset();
    CHECK(wire::TryPeekFrame(p.b.get(), 1024, &got, &has_fds, &partial) ==
          wire::kTruncated);
  }
  {
    Pair p;
    p.a.reset();
    CHECK(wire::TryPeekFrame(p.b.get(), 1024, &got, &has_fds, &partial) ==
          wire::kEof);
  }
}

}  // namespace
}  // namespace kreg
