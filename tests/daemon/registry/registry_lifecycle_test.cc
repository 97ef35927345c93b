// Registry: per-uid limits, retirement of names and garbage collection.
#include <set>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "daemon/registry/registry.h"
#include "tests/daemon/registry/registry_fakes.h"

namespace kreg {
namespace {

constexpr uid_t kAdmin = 4242;  // stands in for kregd's own uid

QuotaLimits Limits(uint64_t registrations, uint64_t bytes) {
  return QuotaLimits{registrations, bytes, kAdmin};
}

// --- per-uid limits ---------------------------------------------------------

TEST_CASE("Registrations per uid are limited, with a clear error",
          "[registry][quota]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log, Limits(2, 1 << 20));
  REQUIRE(registry.Register(ArgsBy(1000, "a", "1")).ok());
  REQUIRE(registry.Register(ArgsBy(1000, "b", "2")).ok());
  auto third = registry.Register(ArgsBy(1000, "c", "3"));
  REQUIRE(third.status().code() == absl::StatusCode::kResourceExhausted);
  std::string msg(third.status().message());
  CHECK_THAT(msg, Catch::Contains("\"c\" (cpu)"));
  CHECK_THAT(msg, Catch::Contains("uid 1000 already has 2 registrations"));
  CHECK_THAT(msg, Catch::Contains("limit per uid is 2"));
  CHECK_THAT(msg, Catch::Contains("max_registrations_per_uid"));
  CHECK_THAT(msg, Catch::Contains("kregctl retire"));
  // Checked before anything is written.
  CHECK(loader.stored.size() == 2);
  // No-ops of what the uid has are still fine; other uids and root are not
  // affected.
  CHECK(registry.Register(ArgsBy(1000, "a", "1")).ok());
  CHECK(registry.Register(ArgsBy(1001, "c", "3")).ok());
  for (int i = 0; i < 5; ++i) {
    CHECK(registry.Register(ArgsBy(0, "root" + std::to_string(i), "r")).ok());
  }
  // In-process targets count too.
  RegisterArgs in = InProcessArgs("k", "fp");
  in.peer.uid = 1000;
  CHECK(registry.Register(in).status().code() ==
        absl::StatusCode::kResourceExhausted);
}

TEST_CASE("Store bytes per uid are limited, with a clear error",
          "[registry][quota]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log, Limits(100, 10));
  REQUIRE(registry.Register(ArgsBy(1000, "a", "123456")).ok());
  // The same module under a second name costs nothing more.
  REQUIRE(registry.Register(ArgsBy(1000, "a2", "123456")).ok());
  auto big = registry.Register(ArgsBy(1000, "b", "abcdefg"));
  REQUIRE(big.status().code() == absl::StatusCode::kResourceExhausted);
  std::string msg(big.status().message());
  CHECK_THAT(msg, Catch::Contains("7-byte module"));
  CHECK_THAT(msg, Catch::Contains("uid 1000's module store use to 13 bytes"));
  CHECK_THAT(msg, Catch::Contains("(now 6)"));
  CHECK_THAT(msg, Catch::Contains("limit per uid is 10 bytes"));
  CHECK_THAT(msg, Catch::Contains("max_store_bytes_per_uid"));
  CHECK(loader.stored.size() == 2);
  CHECK(registry.Register(ArgsBy(1001, "b", "abcdefg")).ok());
  CHECK(registry.Register(ArgsBy(0, "root", "0123456789abcdef")).ok());
  // Retiring frees the quota.
  REQUIRE(registry.Retire("a", Platform::kCpu, {1000, 1000, 1}).ok());
  REQUIRE(registry.Retire("a2", Platform::kCpu, {1000, 1000, 1}).ok());
  CHECK(registry.Register(ArgsBy(1000, "b2", "abcdefg")).ok());
}

// --- retire -----------------------------------------------------------------

TEST_CASE("Retire frees a name for any content; journaled with who and when",
          "[registry][retire]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log, Limits(100, 1 << 20));
  REQUIRE(registry.Register(ArgsBy(1000, "typo", "v1")).ok());
  auto retired = registry.Retire("typo", Platform::kCpu, {1000, 1000, 77});
  REQUIRE(retired.ok());
  REQUIRE(retired->size() == 1);
  CHECK((*retired)[0]->module_digest == Sha256Digest("v1"));
  CHECK(registry.Lookup({"typo", Platform::kCpu}) == nullptr);
  REQUIRE(log.retirements.size() == 1);
  CHECK(log.retirements[0].key.name == "typo");
  CHECK(log.retirements[0].retired_by.uid == 1000);
  CHECK(log.retirements[0].retired_by.pid == 77);
  CHECK(log.retirements[0].retired_at_us > 0);
  CHECK(log.retirements[0].content_id == Sha256Digest("v1"));
  auto again = registry.Register(ArgsBy(1001, "typo", "v2"));
  REQUIRE(again.ok());
  CHECK(again->created);
  // ... and the new content is then protected exactly as before.
  CHECK(registry.Register(ArgsBy(1001, "typo", "v2")).ok());
  CHECK(registry.Register(ArgsBy(1001, "typo", "v3")).status().code() ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("Retire: only the registering uid or root", "[registry][retire]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  REQUIRE(registry.Register(ArgsBy(1000, "op", "m")).ok());
  auto denied = registry.Retire("op", Platform::kCpu, {1001, 1001, 5});
  REQUIRE(denied.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(std::string(denied.status().message()),
             Catch::Contains("\"op\" (cpu)") &&
                 Catch::Contains("registered by uid 1000") &&
                 Catch::Contains("you are uid 1001"));
  CHECK(registry.Lookup({"op", Platform::kCpu}) != nullptr);
  CHECK(log.retirements.empty());
  CHECK(registry.Retire("op", Platform::kCpu, {0, 0, 5}).ok());
}

TEST_CASE("Retire of an unknown name is NOT_FOUND", "[registry][retire]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  REQUIRE(registry.Register(ArgsBy(1000, "op", "m")).ok());
  auto missing = registry.Retire("nope", std::nullopt, {1000, 1000, 5});
  REQUIRE(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(missing.status().message()),
             Catch::Contains("\"nope\"") && Catch::Contains("kregctl list"));
  auto wrong = registry.Retire("op", Platform::kCuda, {1000, 1000, 5});
  REQUIRE(wrong.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(wrong.status().message()),
             Catch::Contains("on platform cuda"));
}

TEST_CASE("Retire is refused while a live session has the target bound",
          "[registry][retire]") {
  FakeLoader loader;
  MemLog log;
  FakeOracle oracle;
  Registry registry(&loader, &log);
  registry.SetBindingOracle(&oracle);
  REQUIRE(registry.Register(ArgsBy(1000, "op", "m")).ok());
  oracle.bound["op"] = {321, 654};
  auto busy = registry.Retire("op", Platform::kCpu, {0, 0, 5});
  REQUIRE(busy.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(busy.status().message()),
             Catch::Contains("\"op\" (cpu)") &&
                 Catch::Contains("pid 321 of uid 1321, pid 654 of uid 1654") &&
                 Catch::Contains("once those processes have exited") &&
                 Catch::Contains("kill PID") &&
                 Catch::Contains("kregctl sessions"));
  CHECK(registry.Lookup({"op", Platform::kCpu}) != nullptr);
  CHECK(log.retirements.empty());
  oracle.bound.clear();
  CHECK(registry.Retire("op", Platform::kCpu, {0, 0, 5}).ok());
}

TEST_CASE("Retire without a platform retires every platform, all or nothing",
          "[registry][retire]") {
  FakeLoader loader;
  MemLog log;
  FakeOracle oracle;
  Registry registry(&loader, &log);
  registry.SetBindingOracle(&oracle);
  REQUIRE(registry.Register(Args("op", "c", "Scale", Platform::kCpu)).ok());
  REQUIRE(registry.Register(Args("op", "g", "Scale", Platform::kCuda)).ok());
  oracle.bound["op"] = {9};
  CHECK_FALSE(registry.Retire("op", std::nullopt, {0, 0, 5}).ok());
  CHECK(registry.Find("op").size() == 2);
  oracle.bound.clear();
  auto both = registry.Retire("op", std::nullopt, {0, 0, 5});
  REQUIRE(both.ok());
  CHECK(both->size() == 2);
  CHECK(registry.Find("op").empty());
  CHECK(log.retirements.size() == 2);
}

TEST_CASE("A journal failure retires nothing", "[registry][retire]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  REQUIRE(registry.Register(Args("op", "m")).ok());
  log.fail = true;
  auto st = registry.Retire("op", Platform::kCpu, {0, 0, 5});
  CHECK(st.status().code() == absl::StatusCode::kInternal);
  CHECK(registry.Lookup({"op", Platform::kCpu}) != nullptr);
}

TEST_CASE("Retiring the last entry of a module removes its store file",
          "[registry][retire][gc]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log, Limits(100, 12));
  REQUIRE(registry.Register(ArgsBy(1000, "a", "12345")).ok());
  REQUIRE(registry.Register(ArgsBy(1000, "a2", "12345")).ok());
  REQUIRE(registry.Register(ArgsBy(1000, "b", "abcde")).ok());
  // Another entry still references the module: it stays.
  REQUIRE(registry.Retire("a", Platform::kCpu, {1000, 1000, 5}).ok());
  CHECK(loader.files.count(Sha256Digest("12345")) == 1);
  // The last one: journaled first, then the file goes.
  REQUIRE(registry.Retire("a2", std::nullopt, {1000, 1000, 5}).ok());
  CHECK(log.retirements.size() == 2);
  CHECK(loader.files == std::set<std::string>{Sha256Digest("abcde")});
  // So a uid that registers fresh modules and retires them stays within its
  // quota and its store use: registrations keep succeeding.
  for (int i = 0; i < 10; ++i) {
    const std::string bytes = "fresh" + std::to_string(i);
    REQUIRE(registry.Register(ArgsBy(1000, "churn", bytes)).ok());
    REQUIRE(registry.Retire("churn", Platform::kCpu, {1000, 1000, 5}).ok());
    CHECK(loader.files.size() == 1);
  }
  // A retirement that is not journaled removes nothing.
  log.fail = true;
  CHECK_FALSE(registry.Retire("b", Platform::kCpu, {1000, 1000, 5}).ok());
  CHECK(loader.files.size() == 1);
}

// --- gc ---------------------------------------------------------------------

TEST_CASE("gc keeps what entries reference and is for admins only",
          "[registry][gc]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log, Limits(100, 1 << 20));
  REQUIRE(registry.Register(ArgsBy(1000, "keep", "k")).ok());
  REQUIRE(registry.Register(ArgsBy(1000, "drop", "d")).ok());
  REQUIRE(registry.Register(InProcessArgs("inproc", "fp")).ok());
  REQUIRE(registry.Retire("drop", Platform::kCpu, {1000, 1000, 5}).ok());
  // A store file no entry references (a crash came between a retirement's
  // record and the file's removal).
  loader.files.insert(Sha256Digest("left"));

  auto denied = registry.CollectGarbage({1000, 1000, 5});
  REQUIRE(denied.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(std::string(denied.status().message()),
             Catch::Contains("root or kregd's own uid (4242)") &&
                 Catch::Contains("uid 1000 may not"));
  CHECK(loader.files.size() == 2);

  auto gc = registry.CollectGarbage({kAdmin, kAdmin, 5});
  REQUIRE(gc.ok());
  CHECK(gc->files_removed == 1);
  CHECK(gc->files_kept == 1);
  CHECK(loader.gc_keep == std::set<std::string>{Sha256Digest("k")});
  CHECK(loader.files == std::set<std::string>{Sha256Digest("k")});
  CHECK(registry.CollectGarbage({0, 0, 5}).ok());
}

}  // namespace
}  // namespace kreg
