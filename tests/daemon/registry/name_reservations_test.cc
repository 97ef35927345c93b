// Registry: operators' name reservations (docs/operator-guide.md, "Name
// reservations").
#include <thread>

#include "catch2/catch.hpp"
#include "tests/daemon/registry/registry_fakes.h"

namespace kreg {
namespace {

constexpr PeerCred kRoot{0, 0, 1};

NameReservation For(const std::string& pattern, uint32_t owner,
                    bool group = false) {
  NameReservation r;
  r.pattern = pattern;
  r.owner = owner;
  r.group = group;
  return r;
}

TEST_CASE("A pattern matches its name or, with '*', its prefix",
          "[registry][reservations]") {
  CHECK(For("lib.*", 1).Matches("lib.op"));
  CHECK(For("lib.*", 1).Matches("lib."));
  CHECK_FALSE(For("lib.*", 1).Matches("lib"));
  CHECK_FALSE(For("lib.*", 1).Matches("other.lib.op"));
  CHECK(For("lib.op", 1).Matches("lib.op"));
  CHECK_FALSE(For("lib.op", 1).Matches("lib.op2"));
}

TEST_CASE("A reserved name is registered only by its owner and root",
          "[registry][reservations]") {
  FakeLoader loader;
  MemLog log;
  RegistrationService registry(&loader, &log);
  REQUIRE(registry.Reserve(For("lib.*", 1000), kRoot).ok());
  auto other = registry.Register(ArgsBy(1001, "lib.op", "aa"));
  REQUIRE(other.status().code() == absl::StatusCode::kPermissionDenied);
  const std::string msg(other.status().message());
  CHECK_THAT(msg, Catch::Contains("target \"lib.op\" (cpu)"));
  CHECK_THAT(msg, Catch::Contains("names matching \"lib.*\" are reserved for "
                                  "uid 1000"));
  CHECK_THAT(msg, Catch::Contains("uid 1001 is not that uid"));
  CHECK_THAT(msg,
             Catch::Contains("`kregctl reserve`, with no pattern, lists them"));
  CHECK(registry.refused() == 1);
  CHECK(loader.stored.empty());  // refused before anything was written
  CHECK(registry.Register(ArgsBy(1000, "lib.op", "aa")).ok());
  CHECK(registry.Register(ArgsBy(0, "lib.root", "bb")).ok());
  CHECK(registry.Register(ArgsBy(1001, "libx.op", "cc")).ok());
}

TEST_CASE("A group reservation admits the caller's gid",
          "[registry][reservations]") {
  FakeLoader loader;
  MemLog log;
  RegistrationService registry(&loader, &log);
  REQUIRE(registry.Reserve(For("team.*", 4242, true), kRoot).ok());
  RegisterArgs member = ArgsBy(1000, "team.op", "aa");
  member.peer.gid = 4242;
  CHECK(registry.Register(member).ok());
  auto outsider = registry.Register(ArgsBy(1001, "team.op2", "bb"));
  REQUIRE(outsider.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(std::string(outsider.status().message()),
             Catch::Contains("reserved for group 4242") &&
                 Catch::Contains("uid 1001 is not in that group"));
}

TEST_CASE("Reserve and Unreserve are for root and kregd's uid, journaled",
          "[registry][reservations]") {
  FakeLoader loader;
  MemLog log;
  RegistryLimits limits;
  limits.admin_uid = 500;
  RegistrationService registry(&loader, &log, limits);
  absl::Status user = registry.Reserve(For("lib.*", 1000), {1000, 1000, 9});
  CHECK(user.code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(std::string(user.message()),
             Catch::Contains("reserving target names is for root or kregd's "
                             "own uid (500); uid 1000 may not do it"));
  REQUIRE(registry.Reserve(For("lib.*", 1000), {500, 500, 9}).ok());
  REQUIRE(log.reservations.size() == 1);
  CHECK(log.reservations[0].first.by.uid == 500);
  CHECK_FALSE(log.reservations[0].second);
  // A second reservation of the pattern replaces the first.
  REQUIRE(registry.Reserve(For("lib.*", 1001), kRoot).ok());
  REQUIRE(registry.Reservations().size() == 1);
  CHECK(registry.Reservations()[0].owner == 1001);
  CHECK(registry.Unreserve("lib.*", {1000, 1000, 9}).code() ==
        absl::StatusCode::kPermissionDenied);
  REQUIRE(registry.Unreserve("lib.*", kRoot).ok());
  CHECK(log.reservations.back().second);
  CHECK(registry.Reservations().empty());
  absl::Status again = registry.Unreserve("lib.*", kRoot);
  CHECK(again.code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(again.message()),
             Catch::Contains("no reservation of \"lib.*\" to lift"));
  CHECK(registry.Register(ArgsBy(1000, "lib.op", "aa")).ok());
}

TEST_CASE("A journal failure reserves nothing", "[registry][reservations]") {
  FakeLoader loader;
  MemLog log;
  RegistrationService registry(&loader, &log);
  log.fail = true;
  CHECK(registry.Reserve(For("lib.*", 1000), kRoot).code() ==
        absl::StatusCode::kInternal);
  CHECK(registry.Reservations().empty());
}

TEST_CASE("A pattern over others' registrations is refused, naming them",
          "[registry][reservations]") {
  FakeLoader loader;
  MemLog log;
  RegistrationService registry(&loader, &log);
  REQUIRE(registry.Register(ArgsBy(1001, "lib.taken", "aa")).ok());
  REQUIRE(registry.Register(ArgsBy(1000, "lib.mine", "bb")).ok());
  absl::Status st = registry.Reserve(For("lib.*", 1000), kRoot);
  REQUIRE(st.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(st.message()),
             Catch::Contains("target \"lib.taken\" (cpu) by uid 1001") &&
                 Catch::Contains("kregctl retire") &&
                 !Catch::Contains("lib.mine"));
  CHECK(log.reservations.empty());
  // The owner's own registrations do not stand in the way.
  CHECK(registry.Reserve(For("lib.mine", 1000), kRoot).ok());
}

TEST_CASE("A reservation waits for a registration in progress",
          "[registry][reservations][concurrency]") {
  FakeLoader loader;
  MemLog log;
  RegistrationService registry(&loader, &log);
  RegisterArgs slow_args = ArgsBy(1001, "lib.slow", "s");
  slow_args.func_name = "Slow";
  absl::StatusOr<RegisterOutcome> slow;
  std::thread first([&] { slow = registry.Register(slow_args); });
  loader.AwaitSlowProbes(1);
  absl::Status reserved;
  std::thread reserve(
      [&] { reserved = registry.Reserve(For("lib.*", 1000), kRoot); });
  loader.OpenGate();
  first.join();
  reserve.join();
  // The registration decided before the reservation: it stands, and the
  // reservation over it is refused.
  REQUIRE(slow.ok());
  CHECK(reserved.code() == absl::StatusCode::kFailedPrecondition);
}

// Cluster mode, as far as Reserve sees it: what is published, or etcd
// out of reach.
class FakeAuthority : public BindingAuthority {
 public:
  std::vector<std::pair<std::string, bool>> published;
  bool reachable = true;

  absl::Status PublishReservation(const NameReservation& r,
                                  bool lifted) override {
    if (!reachable) return absl::UnavailableError("etcd is not answering");
    published.emplace_back(r.pattern, lifted);
    return absl::OkStatus();
  }
  std::string HostName() const override { return "h"; }
  absl::StatusOr<ClaimResult> Claim(const TargetEntry&) override {
    if (!reachable) return absl::UnavailableError("etcd is not answering");
    return ClaimResult{true, {}};
  }
  absl::Status Replace(const TargetEntry&, const TargetEntry&) override {
    return absl::UnimplementedError("not in these tests");
  }
  void Unclaim(const TargetEntry&) override {}
  absl::Status Release(const TargetEntry&) override { return absl::OkStatus(); }
  absl::StatusOr<std::string> FetchModule(const std::string&,
                                          uint64_t) override {
    return absl::UnavailableError("not here");
  }
  void PublishAck(const TargetEntry&, const std::vector<Repointer::Laggard>&,
                  const std::string&) override {}
  PeerAcks AwaitPeerAcks(const TargetEntry&, absl::Time) override { return {}; }
};

TEST_CASE("Reservations are restored at start-up", "[registry][reservations]") {
  FakeLoader loader;
  MemLog log;
  RegistrationService registry(&loader, &log);
  registry.RestoreReservation(For("lib.*", 1000));
  CHECK(registry.Register(ArgsBy(1001, "lib.op", "aa")).status().code() ==
        absl::StatusCode::kPermissionDenied);
}

TEST_CASE("In cluster mode a reservation is published before it holds here",
          "[registry][reservations]") {
  FakeLoader loader;
  MemLog log;
  RegistrationService registry(&loader, &log);
  FakeAuthority cluster;
  registry.reservations().SetBindingAuthority(&cluster);
  REQUIRE(registry.Reserve(For("lib.*", 1000), kRoot).ok());
  REQUIRE(registry.Unreserve("lib.*", kRoot).ok());
  CHECK(cluster.published == std::vector<std::pair<std::string, bool>>{
                                 {"lib.*", false}, {"lib.*", true}});
  // etcd out of reach: nothing is reserved or lifted here only.
  cluster.reachable = false;
  absl::Status st = registry.Reserve(For("other.*", 1000), kRoot);
  CHECK(st.code() == absl::StatusCode::kUnavailable);
  CHECK(registry.Reservations().empty());
  cluster.reachable = true;
  CHECK(registry.Register(ArgsBy(1001, "other.op", "aa")).ok());
  REQUIRE(registry.Reserve(For("kept.*", 1000), kRoot).ok());
  cluster.reachable = false;
  CHECK(registry.Unreserve("kept.*", kRoot).code() ==
        absl::StatusCode::kUnavailable);
  CHECK(registry.Reservations().size() == 1);
}

TEST_CASE("A reservation from another host is journaled and holds here",
          "[registry][reservations]") {
  FakeLoader loader;
  MemLog log;
  RegistrationService registry(&loader, &log);
  NameReservation r = For("team.*", 4242, /*group=*/true);
  r.by = PeerCred{0, 0, 77};
  REQUIRE(registry.reservations().Mirror(r, false).ok());
  REQUIRE(registry.reservations().Mirror(r, false).ok());  // again: a no-op
  CHECK(log.reservations.size() == 1);
  CHECK(registry.Register(ArgsBy(1001, "team.op", "aa")).status().code() ==
        absl::StatusCode::kPermissionDenied);
  REQUIRE(registry.reservations().Mirror(r, true).ok());
  REQUIRE(registry.reservations().Mirror(r, true).ok());  // lifted already
  CHECK(log.reservations.size() == 2);
  CHECK(registry.Register(ArgsBy(1001, "team.op", "aa")).ok());
}

}  // namespace
}  // namespace kreg
