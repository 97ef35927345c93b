#include "daemon/base/uid_account.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"

namespace kreg {
namespace {

UidLimits Limits() {
  UidLimits l{};
  l[static_cast<size_t>(UidResource::kControlConnections)] = 2;
  l[static_cast<size_t>(UidResource::kUploadBytes)] = 1000;
  l[static_cast<size_t>(UidResource::kHeavyWork)] = 1;
  return l;
}

TEST_CASE("A uid over its limit is refused naming the limit; others are not",
          "[uid_account]") {
  UidAccount account(Limits());
  auto a = account.Take(1000, UidResource::kControlConnections, 1);
  auto b = account.Take(1000, UidResource::kControlConnections, 1);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  auto c = account.Take(1000, UidResource::kControlConnections, 1);
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(c.status().message() ==
        "uid 1000 holds 2 control connections already; 1 more would exceed "
        "its limit of 2 (max_control_connections_per_uid): wait for its "
        "other requests to end or close some, or ask the operator to raise "
        "max_control_connections_per_uid");
  // Another uid keeps its share.
  CHECK(account.Take(1001, UidResource::kControlConnections, 1).ok());
  // Given back when a charge ends.
  a->Release();
  CHECK(account.Held(1000, UidResource::kControlConnections) == 1);
  CHECK(account.Take(1000, UidResource::kControlConnections, 1).ok());
}

TEST_CASE("Bytes are charged by amount, with the unit in the refusal",
          "[uid_account]") {
  UidAccount account(Limits());
  auto a = account.Take(7, UidResource::kUploadBytes, 600);
  REQUIRE(a.ok());
  auto b = account.Take(7, UidResource::kUploadBytes, 401);
  REQUIRE_FALSE(b.ok());
  CHECK(b.status().message() ==
        "uid 7 holds 600 bytes of module uploads in flight already; 401 bytes "
        "more would exceed its limit of 1000 bytes (max_upload_bytes_per_uid): "
        "wait for its other requests to end or close some, or ask the "
        "operator to raise max_upload_bytes_per_uid");
  CHECK(account.Take(7, UidResource::kUploadBytes, 400).ok());
  // More than the limit at once never fits, even for a uid holding nothing.
  CHECK_FALSE(account.Take(8, UidResource::kUploadBytes, 1001).ok());
  CHECK(account.Held(8, UidResource::kUploadBytes) == 0);
}

TEST_CASE("A charge moves and is given back once", "[uid_account]") {
  UidAccount account(Limits());
  {
    auto a = account.Take(5, UidResource::kUploadBytes, 10);
    REQUIRE(a.ok());
    UidAccount::Charge moved = *std::move(a);
    CHECK(moved.amount() == 10);
    UidAccount::Charge again;
    again = std::move(moved);
    CHECK(account.Held(5, UidResource::kUploadBytes) == 10);
  }
  CHECK(account.Held(5, UidResource::kUploadBytes) == 0);
}

TEST_CASE("Snapshot lists what each uid holds, and nothing at zero",
          "[uid_account]") {
  UidAccount account(Limits());
  CHECK(account.Snapshot().empty());
  auto a = account.Take(1000, UidResource::kControlConnections, 2);
  auto b = account.Take(7, UidResource::kUploadBytes, 300);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  std::vector<UidAccount::Holding> rows = account.Snapshot();
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].uid == 7);
  CHECK(rows[0].resource == UidResource::kUploadBytes);
  CHECK(rows[0].held == 300);
  CHECK(rows[1].uid == 1000);
  CHECK(rows[1].resource == UidResource::kControlConnections);
  CHECK(rows[1].held == 2);
  CHECK(std::string(InfoOf(rows[1].resource).label) == "control_connections");
  b->Release();
  rows = account.Snapshot();
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].uid == 1000);
}

TEST_CASE(
    "Keep charges what a uid holds already past its limit; Take is refused "
    "until it is back under",
    "[uid_account]") {
  UidAccount account(Limits());
  UidAccount::Charge a =
      account.Keep(1000, UidResource::kControlConnections, 2);
  UidAccount::Charge b =
      account.Keep(1000, UidResource::kControlConnections, 1);
  CHECK(account.Held(1000, UidResource::kControlConnections) == 3);
  CHECK_FALSE(account.Take(1000, UidResource::kControlConnections, 1).ok());
  b.Release();
  CHECK_FALSE(account.Take(1000, UidResource::kControlConnections, 1).ok());
  a.Release();
  CHECK(account.Held(1000, UidResource::kControlConnections) == 0);
  CHECK(account.Take(1000, UidResource::kControlConnections, 1).ok());
}

TEST_CASE("A limit of 0 is unlimited", "[uid_account]") {
  UidAccount account(Limits());
  std::vector<UidAccount::Charge> held;
  for (int i = 0; i < 1000; ++i) {
    auto c = account.Take(3, UidResource::kSessions, 1);
    REQUIRE(c.ok());
    held.push_back(*std::move(c));
  }
  CHECK(account.Held(3, UidResource::kSessions) == 1000);
}

TEST_CASE(
    "TakeWithin waits for the uid's own work, then refuses at the "
    "deadline",
    "[uid_account]") {
  UidAccount account(Limits());
  auto first = account.Take(9, UidResource::kHeavyWork, 1);
  REQUIRE(first.ok());
  // Another uid is not queued behind uid 9.
  CHECK(account.TakeWithin(10, UidResource::kHeavyWork, 1, absl::Now()).ok());
  // Past the deadline: refused, naming the limit.
  auto late = account.TakeWithin(9, UidResource::kHeavyWork, 1,
                                 absl::Now() + absl::Milliseconds(50));
  REQUIRE_FALSE(late.ok());
  CHECK(late.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(late.status().message()).find("(max_heavy_work_per_uid)") !=
        std::string::npos);
  // Given back while waiting: the waiter gets it.
  std::atomic<bool> got{false};
  std::thread waiter([&] {
    auto c = account.TakeWithin(9, UidResource::kHeavyWork, 1,
                                absl::Now() + absl::Seconds(30));
    got = c.ok();
  });
  first->Release();
  waiter.join();
  CHECK(got.load());
}

TEST_CASE("Concurrent charges never exceed the limit", "[uid_account]") {
  UidAccount account(Limits());
  std::atomic<int> over{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        auto c = account.Take(4, UidResource::kControlConnections, 1);
        if (c.ok() && account.Held(4, UidResource::kControlConnections) > 2) {
          over++;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(over.load() == 0);
  CHECK(account.Held(4, UidResource::kControlConnections) == 0);
}

}  // namespace
}  // namespace kreg
