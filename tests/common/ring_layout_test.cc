#include <thread>

#include "catch2/catch.hpp"
#include "common/ring_layout.h"

namespace kreg {
namespace ring {
namespace {

constexpr int64_t kUs = 1000;

// Runs `n` waits that each took `waited_ns` (spinning when the policy
// said so, never preempted) and returns the spin it asks for next.
int64_t Feed(SpinPolicy* p, int n, int64_t waited_ns) {
  for (int i = 0; i < n; ++i) {
    const int64_t spin = p->Next();
    p->Record(waited_ns, spin > 0, /*preempted=*/false);
  }
  return p->Next();
}

TEST_CASE("SpinPolicy: a fast partner keeps the full spin", "[ring]") {
  SpinPolicy p(50 * kUs, /*adaptive=*/true);
  CHECK(p.Next() == 50 * kUs);  // no history: the configured spin
  // Waits of 3-10 us (a handler on the other side of the ring).
  for (int i = 0; i < 1000; ++i) {
    const int64_t spin = p.Next();
    REQUIRE(spin == 50 * kUs);
    p.Record((3 + i % 8) * kUs, true, false);
  }
}

TEST_CASE("SpinPolicy: waits a little over the spin stretch it", "[ring]") {
  // A client whose gaps between calls are 120 us (a GPU round trip):
  // spins cover them, up to kStretch times the configured spin.
  SpinPolicy p(50 * kUs, true);
  const int64_t spin = Feed(&p, 20, 120 * kUs);
  CHECK(spin >= 120 * kUs);
  CHECK(spin <= SpinPolicy::kStretch * 50 * kUs);
}

TEST_CASE("SpinPolicy: a slow partner makes it sleep at once", "[ring]") {
  SpinPolicy p(50 * kUs, true);
  // Waits of 5 ms (a long handler, or an idle session): each halves the
  // spin, then it sleeps at once.
  int64_t last = p.Next();
  for (int i = 0; i < 3; ++i) {
    p.Record(5000 * kUs, last > 0, false);
    const int64_t next = p.Next();
    CHECK(next < last);
    last = next;
  }
  CHECK(Feed(&p, 10, 5000 * kUs) == 0);
  // Still asleep at once after many more (an idle session burns nothing).
  CHECK(Feed(&p, 10000, 5000 * kUs) == 0);
  // The partner is fast again: the first wait it sees (woken from a
  // sleep, so the wake-up is in it) is short enough, and it spins again.
  p.Record(30 * kUs, false, false);
  CHECK(p.Next() >= 50 * kUs);
}

TEST_CASE("SpinPolicy: one long wait does not stop the spinning", "[ring]") {
  SpinPolicy p(50 * kUs, true);
  Feed(&p, 100, 4 * kUs);
  p.Record(2'000'000 * kUs, true, false);  // a pause in the caller's loop
  CHECK(p.Next() > 0);
  p.Record(4 * kUs, true, false);
  CHECK(p.Next() == 50 * kUs);
}

TEST_CASE("SpinPolicy: an oversubscribed machine backs off exponentially",
          "[ring]") {
  SpinPolicy p(50 * kUs, true);
  Feed(&p, 10, 4 * kUs);
  // Every spin loses its CPU: the sleeps-at-once between spins grow
  // 1, 2, 4 ... up to kMaxBackoff.
  int expected_skip = 1;
  for (int round = 0; round < 10; ++round) {
    REQUIRE(p.Next() > 0);  // a spin (which is preempted)
    p.Record(300 * kUs, true, /*preempted=*/true);
    int skipped = 0;
    while (p.Next() == 0) {
      p.Record(20 * kUs, false, false);  // slept, and it was short
      ++skipped;
      REQUIRE(skipped <= SpinPolicy::kMaxBackoff);
    }
    CHECK(skipped == expected_skip);
    expected_skip = std::min(expected_skip * 2, SpinPolicy::kMaxBackoff);
    // The spin Next() just granted is preempted again next round.
  }
  // Spins that keep their CPU again shrink the backoff to nothing.
  for (int i = 0; i < 10; ++i) {
    const int64_t spin = p.Next();
    p.Record(4 * kUs, spin > 0, false);
  }
  CHECK(p.Next() == 50 * kUs);
  p.Record(4 * kUs, true, false);
  CHECK(p.Next() == 50 * kUs);
}

TEST_CASE("SpinPolicy: not adaptive or no spin configured", "[ring]") {
  SpinPolicy fixed(50 * kUs, /*adaptive=*/false);  // KREG_RING_ADAPTIVE=0
  fixed.Record(0, true, /*preempted=*/true);
  CHECK(Feed(&fixed, 100, 5000 * kUs) == 50 * kUs);
  SpinPolicy never(0, true);  // ring_spin_us = 0
  CHECK(Feed(&never, 10, 1 * kUs) == 0);
  SpinPolicy negative(-5, true);
  CHECK(negative.Next() == 0);
}

TEST_CASE("BusyAfter: only a clearly oversubscribed machine vetoes spins",
          "[ring]") {
  // 2 CPUs: a client, an executor and a JAX thread (3 runnable) are not
  // busy; 5 are.
  CHECK_FALSE(BusyAfter(false, 3, 2));
  CHECK_FALSE(BusyAfter(false, 4, 2));
  CHECK(BusyAfter(false, 5, 2));
  // Once busy, it stays busy until the runnable threads fit the CPUs.
  CHECK(BusyAfter(true, 4, 2));
  CHECK(BusyAfter(true, 3, 2));
  CHECK_FALSE(BusyAfter(true, 2, 2));
  CHECK(BusyAfter(false, 33, 16));
  CHECK_FALSE(BusyAfter(false, 32, 16));
}

TEST_CASE("SpinWhileEqual reports a spin that lost its CPU", "[ring]") {
  Word w{};
  Store(w, 7);
  bool preempted = false;
  CHECK_FALSE(SpinWhileEqual(w, 7, 200 * kUs, &preempted));
  // A thread alone on an idle CPU is not preempted in 200 us (the test
  // cannot force it to be on every machine, so only this direction).
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    Store(w, 8);
  });
  CHECK(SpinWhileEqual(w, 7, 2'000'000 * kUs, &preempted));
  writer.join();
}

TEST_CASE("SpinThenWait tells its policy how long the wait took", "[ring]") {
  Word w{};
  Word waiting{};
  SpinPolicy p(50 * kUs, true);
  // A partner that answers after 20 ms: slept, and long: each halves
  // the spin. A wait whose spin lost its CPU (TSan on a loaded machine)
  // counts as preempted instead, and the next waits sleep at once; of 8
  // waits at most 3 can be preempted (the backoff doubles), so at least 5
  // halve it.
  for (int i = 0; i < 8; ++i) {
    Store(w, 0);
    std::thread partner([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      Store(w, 1);
      FutexWake(&w);
    });
    CHECK(SpinThenWait(&w, 0, &waiting, &p, -1));
    partner.join();
    CHECK(Load(waiting) == 0);
  }
  CHECK(p.Next() <= 50 * kUs / 8);
  // A sleep slice that ends with no change returns false and counts long.
  Store(w, 0);
  CHECK_FALSE(SpinThenWait(&w, 0, &waiting, &p, 1'000'000));
}

}  // namespace
}  // namespace ring
}  // namespace kreg
