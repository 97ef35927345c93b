#include "daemon/base/log_limit.h"

#include "catch2/catch.hpp"

namespace kreg {
namespace {

using std::chrono::seconds;

TEST_CASE("A burst is allowed, then lines are dropped and counted",
          "[log_limit]") {
  LogLimiter limiter(3, seconds(10));
  LogLimiter::Clock::time_point t0{};
  bool allowed = false;
  for (int i = 0; i < 3; ++i) {
    CHECK(limiter.Check("uid 1000", t0 + seconds(1), &allowed).empty());
    CHECK(allowed);
  }
  for (int i = 0; i < 50; ++i) {
    limiter.Check("uid 1000", t0 + seconds(2), &allowed);
    CHECK_FALSE(allowed);
  }
  // Another peer is not affected.
  limiter.Check("uid 1001", t0 + seconds(2), &allowed);
  CHECK(allowed);
  // The next window's first line says what was dropped.
  std::string suffix = limiter.Check("uid 1000", t0 + seconds(12), &allowed);
  CHECK(allowed);
  CHECK(suffix == " (50 similar lines suppressed in the last 11 s)");
  CHECK(limiter.Check("uid 1000", t0 + seconds(13), &allowed).empty());
  CHECK(allowed);
}

TEST_CASE("Many keys do not grow the limiter without bound", "[log_limit]") {
  LogLimiter limiter(1, seconds(1));
  LogLimiter::Clock::time_point t0{};
  bool allowed = false;
  for (int i = 0; i < 20000; ++i) {
    limiter.Check("uid " + std::to_string(i), t0 + seconds(2 * i), &allowed);
    CHECK(allowed);
  }
}

}  // namespace
}  // namespace kreg
