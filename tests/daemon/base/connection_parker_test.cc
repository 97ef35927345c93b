#include "daemon/base/connection_parker.h"

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "common/unique_fd.h"
#include "tests/testing/socket_pair.h"

namespace kreg {
namespace {

using Wake = ConnectionParker::Wake;

using Pair = testing::SocketPair;

// Waits (with a generous deadline) until `cond` holds.
template <typename F>
bool Eventually(F cond) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!cond()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

TEST_CASE("A parked connection runs its step when bytes arrive",
          "[connection_parker]") {
  ConnectionParker parker;
  REQUIRE(parker.Start().ok());
  Pair p;
  std::atomic<int> woke{-1};
  parker.Park(1, p.b.get(), absl::InfiniteFuture(),
              [&](Wake why) { woke = static_cast<int>(why); });
  REQUIRE(::write(p.a.get(), "x", 1) == 1);
  REQUIRE(Eventually([&] { return woke.load() >= 0; }));
  CHECK(woke.load() == static_cast<int>(Wake::kReadable));
  parker.Forget(1);
  CHECK(parker.watched() == 0);
}

TEST_CASE("A parked connection runs its step at its deadline",
          "[connection_parker]") {
  ConnectionParker parker;
  REQUIRE(parker.Start().ok());
  Pair p;
  std::atomic<int> woke{-1};
  const absl::Time start = absl::Now();
  absl::Time ran;
  parker.Park(1, p.b.get(), start + absl::Milliseconds(50), [&](Wake why) {
    ran = absl::Now();
    woke = static_cast<int>(why);
  });
  REQUIRE(Eventually([&] { return woke.load() >= 0; }));
  CHECK(woke.load() == static_cast<int>(Wake::kTimedOut));
  CHECK(ran - start >= absl::Milliseconds(50));
}

TEST_CASE("Bytes already there, or that came while the step ran, wake it",
          "[connection_parker]") {
  ConnectionParker parker;
  REQUIRE(parker.Start().ok());
  Pair p;
  REQUIRE(::write(p.a.get(), "x", 1) == 1);
  std::atomic<int> steps{0};
  // First park: the byte is there already.
  parker.Park(1, p.b.get(), absl::InfiniteFuture(), [&](Wake) { ++steps; });
  REQUIRE(Eventually([&] { return steps.load() == 1; }));
  // More bytes while no step is parked: the next park runs at once.
  REQUIRE(::write(p.a.get(), "y", 1) == 1);
  absl::SleepFor(absl::Milliseconds(20));  // let the event come unparked
  parker.Park(1, p.b.get(), absl::InfiniteFuture(), [&](Wake) { ++steps; });
  REQUIRE(Eventually([&] { return steps.load() == 2; }));
}

TEST_CASE("Bytes that were seen already do not wake a step again",
          "[connection_parker]") {
  // A half frame sits in the socket: the step parks again and is woken
  // only by new bytes (no CPU while it waits).
  ConnectionParker parker;
  REQUIRE(parker.Start().ok());
  Pair p;
  REQUIRE(::write(p.a.get(), "half", 4) == 4);
  std::atomic<int> steps{0};
  std::function<void(Wake)> step = [&](Wake) {
    ++steps;
    parker.Park(1, p.b.get(), absl::InfiniteFuture(), step);
  };
  parker.Park(1, p.b.get(), absl::InfiniteFuture(), step);
  REQUIRE(Eventually([&] { return steps.load() >= 1; }));
  absl::SleepFor(absl::Milliseconds(200));
  CHECK(steps.load() == 1);
  REQUIRE(::write(p.a.get(), "more", 4) == 4);
  REQUIRE(Eventually([&] { return steps.load() == 2; }));
  parker.Forget(1);
}

TEST_CASE("Many parked connections hold no thread each; stopping wakes all",
          "[connection_parker]") {
  ConnectionParker parker;
  REQUIRE(parker.Start().ok());
  std::vector<Pair> pairs(300);
  std::atomic<int> stopped{0};
  for (size_t i = 0; i < pairs.size(); ++i) {
    parker.Park(i, pairs[i].b.get(), absl::InfiniteFuture(), [&](Wake why) {
      if (why == Wake::kStopping) ++stopped;
    });
  }
  CHECK(parker.watched() == 300);
  CHECK(parker.workers() == 0);
  parker.StopParking();
  REQUIRE(Eventually([&] { return stopped.load() == 300; }));
  // A park after StopParking runs at once, with kStopping.
  std::atomic<int> late{-1};
  parker.Park(1000, pairs[0].b.get(), absl::InfiniteFuture(),
              [&](Wake why) { late = static_cast<int>(why); });
  REQUIRE(Eventually([&] { return late.load() >= 0; }));
  CHECK(late.load() == static_cast<int>(Wake::kStopping));
  parker.Join();
  CHECK(parker.workers() == 0);
}

TEST_CASE("Idle workers beyond a few exit", "[connection_parker]") {
  ConnectionParker parker(absl::Milliseconds(20));
  REQUIRE(parker.Start().ok());
  absl::Notification go;
  std::atomic<int> running{0};
  for (int i = 0; i < 8; ++i) {
    parker.Run([&](Wake) {
      ++running;
      go.WaitForNotification();
    });
  }
  REQUIRE(Eventually([&] { return running.load() == 8; }));
  // One worker per step, and more while steps waited kStarvedAfter for the
  // first ones to start (a slow machine, TSan): at most one per step again.
  CHECK(parker.workers() >= 8);
  CHECK(parker.workers() <= 16);
  go.Notify();
  REQUIRE(Eventually([&] { return parker.workers() <= 2; }));
}

TEST_CASE("A burst starts a few workers; blocked ones do not starve the rest",
          "[connection_parker]") {
  ConnectionParker parker;
  REQUIRE(parker.Start().ok());
  absl::Notification go;
  std::atomic<int> blocked{0};
  // 40 steps that block: 16 workers start at once, then one more every
  // few milliseconds while work waits with none idle.
  for (int i = 0; i < 40; ++i) {
    parker.Run([&](Wake) {
      ++blocked;
      go.WaitForNotification();
    });
  }
  REQUIRE(Eventually([&] { return blocked.load() == 40; }));
  // A short step behind them still runs.
  std::atomic<bool> ran{false};
  parker.Run([&](Wake) { ran = true; });
  REQUIRE(Eventually([&] { return ran.load(); }));
  go.Notify();
  // 300 short steps at once start no more than the burst's workers.
  ConnectionParker burst;
  REQUIRE(burst.Start().ok());
  std::atomic<int> done{0};
  for (int i = 0; i < 300; ++i) burst.Run([&](Wake) { ++done; });
  REQUIRE(Eventually([&] { return done.load() == 300; }));
  CHECK(burst.workers() <= 20);
}

}  // namespace
}  // namespace kreg
