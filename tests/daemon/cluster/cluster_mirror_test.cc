// ClusterMirror, the registry in cluster mode: claims through a
// BindingAuthority (an in-memory stand-in for etcd shared by several
// registries, i.e. hosts), mirroring and retirement. The etcd-backed authority
// itself is exercised end to end in tests/python/test_cluster.py.
#include "daemon/cluster/cluster_mirror.h"

#include <unistd.h>

#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "daemon/store/module_store.h"
#include "tests/daemon/registry/registry_fakes.h"

namespace kreg {
namespace {

// The bindings of one cluster, shared by the hosts' authorities.
struct FakeEtcd {
  std::map<TargetKey, TargetEntry> bindings;
  std::map<std::string, std::string> modules;  // digest -> bytes peers serve
  bool up = true;
  bool lose_answer = false;  // the next Replace is applied, then "times out"
  // Acknowledgements (PublishAck): target name -> host -> the last one.
  struct Ack {
    uint32_t generation = 0;
    std::vector<Repointer::Laggard> laggards;
    std::string error;
  };
  std::map<std::string, std::map<std::string, Ack>> acks;
  std::set<std::string> live;  // the hosts AwaitPeerAcks waits for
  // Runs once, at the start of the next AwaitPeerAcks (the other hosts
  // mirror meanwhile).
  std::function<void()> while_waiting;
};

class FakeAuthority : public BindingAuthority {
 public:
  FakeAuthority(FakeEtcd* etcd, std::string host)
      : etcd_(etcd), host_(std::move(host)) {}
  std::string HostName() const override { return host_; }
  absl::StatusOr<ClaimResult> Claim(const TargetEntry& proposed) override {
    if (!etcd_->up) return absl::UnavailableError("etcd is down");
    ++claims;
    auto it = etcd_->bindings.find(proposed.key);
    if (it == etcd_->bindings.end()) {
      etcd_->bindings[proposed.key] = proposed;
      return ClaimResult{true, {}};
    }
    return ClaimResult{false, it->second};
  }
  // Compare-and-swap like ClusterRegistry::Replace (its messages are
  // checked end to end in tests/python/test_cluster_replace.py).
  absl::Status Replace(const TargetEntry& current,
                       const TargetEntry& next) override {
    if (!etcd_->up) return absl::UnavailableError("etcd is down");
    ++replaces;
    auto it = etcd_->bindings.find(next.key);
    if (it == etcd_->bindings.end()) {
      return absl::FailedPreconditionError("no binding in etcd");
    }
    if (it->second.content_id == next.content_id &&
        it->second.generation == next.generation) {
      return absl::OkStatus();  // a retry whose first answer was lost
    }
    if (it->second.content_id != current.content_id ||
        it->second.generation != current.generation) {
      return absl::AbortedError(
          absl::StrCat("generation ", it->second.generation,
                       " was made on host ", it->second.host));
    }
    it->second = next;
    if (std::exchange(etcd_->lose_answer, false)) {
      return absl::UnavailableError("deadline exceeded");
    }
    return absl::OkStatus();
  }
  void Unclaim(const TargetEntry& claimed) override {
    ++unclaims;
    etcd_->bindings.erase(claimed.key);
  }
  absl::Status Release(const TargetEntry& entry) override {
    if (!etcd_->up) return absl::UnavailableError("etcd is down");
    etcd_->bindings.erase(entry.key);
    return absl::OkStatus();
  }
  absl::Status PublishReservation(const NameReservation&, bool) override {
    return absl::UnimplementedError("not in these tests");
  }
  absl::StatusOr<std::string> FetchModule(const std::string& digest,
                                          uint64_t) override {
    ++fetches;
    auto it = etcd_->modules.find(digest);
    if (it == etcd_->modules.end()) return absl::NotFoundError("no peer");
    return it->second;
  }
  void PublishAck(const TargetEntry& entry,
                  const std::vector<Repointer::Laggard>& laggards,
                  const std::string& error) override {
    etcd_->acks[entry.key.name][host_] = {entry.generation, laggards, error};
  }
  // As ClusterRegistry::AwaitPeerAcks, without the wait: the live hosts'
  // acknowledgements once `while_waiting` ran.
  PeerAcks AwaitPeerAcks(const TargetEntry& entry,
                         absl::Time deadline) override {
    ack_budget = deadline - absl::Now();
    if (auto f = std::exchange(etcd_->while_waiting, nullptr)) f();
    PeerAcks out;
    for (const std::string& host : etcd_->live) {
      if (host == host_) continue;
      auto ack = etcd_->acks[entry.key.name].find(host);
      if (ack == etcd_->acks[entry.key.name].end() ||
          ack->second.generation < entry.generation) {
        out.hosts.push_back({host, ""});
        continue;
      }
      for (Repointer::Laggard l : ack->second.laggards) {
        l.host = host;
        out.laggards.push_back(l);
      }
      if (!ack->second.error.empty()) {
        out.hosts.push_back({host, ack->second.error});
      }
    }
    return out;
  }
  int claims = 0, unclaims = 0, fetches = 0, replaces = 0;
  absl::Duration ack_budget;

 private:
  FakeEtcd* const etcd_;
  const std::string host_;
};

struct Host {
  Host(FakeEtcd* etcd, const std::string& name, RegistryLimits limits = {})
      : registry(&loader, &log, limits),
        authority(etcd, name),
        mirror(&registry.core(), &registry.reservations(),
               &registry.replacement(), &authority) {
    registry.SetRepointer(&repointer);
    registry.SetBindingOracle(&oracle);
  }
  FakeLoader loader;
  MemLog log;
  RegistrationService registry;
  FakeAuthority authority;
  ClusterMirror mirror;
  FakeRepointer repointer;
  FakeOracle oracle;
};

RegistryLimits Owner() {
  RegistryLimits limits;
  limits.replace_by_owner = true;
  return limits;
}

RegisterArgs ReplaceBy(uid_t uid, const std::string& bytes) {
  RegisterArgs a = ArgsBy(uid, "op", bytes);
  a.replace = true;
  return a;
}

TEST_CASE(
    "The first registration anywhere wins; others are refused naming "
    "its host and uid",
    "[cluster][mirror]") {
  FakeEtcd etcd;
  Host a(&etcd, "a (10.0.0.1:7390)"), b(&etcd, "b (10.0.0.2:7390)");
  auto first = a.registry.Register(ArgsBy(1000, "op", "bytes-1"));
  REQUIRE(first.ok());
  CHECK(first->created);
  CHECK(first->entry->host == "a (10.0.0.1:7390)");
  auto other = b.registry.Register(ArgsBy(1001, "op", "bytes-2"));
  REQUIRE(other.status().code() == absl::StatusCode::kFailedPrecondition);
  std::string msg(other.status().message());
  CHECK_THAT(msg, Catch::Contains("first registered on host a (10.0.0.1:7390) "
                                  "by uid 1000"));
  CHECK_THAT(msg, Catch::Contains(Sha256Digest("bytes-1")));
  CHECK_THAT(msg, Catch::Contains("distinct target name"));
  // Nothing of the refused module stays on b, nothing was journaled.
  CHECK(b.log.entries.empty());
  CHECK(b.loader.files.empty());
  CHECK(b.loader.temps.empty());
  CHECK(b.registry.Lookup({"op", Platform::kCpu}) == nullptr);
  CHECK(b.registry.refused() == 1);
}

TEST_CASE(
    "An equal registration on another host is a no-op that binds "
    "locally",
    "[cluster][mirror]") {
  FakeEtcd etcd;
  Host a(&etcd, "a"), b(&etcd, "b");
  REQUIRE(a.registry.Register(ArgsBy(1000, "op", "same")).ok());
  auto again = b.registry.Register(ArgsBy(1001, "op", "same"));
  REQUIRE(again.ok());
  CHECK_FALSE(again->created);
  CHECK(again->entry->host == "a");  // the binding, as made on a
  CHECK(again->entry->registered_by.uid == 1000);
  CHECK(b.loader.files.count(Sha256Digest("same")) == 1);
  REQUIRE(b.log.entries.size() == 1);
  CHECK(b.authority.fetches == 0);
}

TEST_CASE(
    "A rebuild equal by content_id runs the binding's module, fetched "
    "from a peer",
    "[cluster][mirror]") {
  FakeEtcd etcd;
  Host a(&etcd, "a"), b(&etcd, "b");
  RegisterArgs first = ArgsBy(1000, "op", "build-on-a");
  first.content_id = "cache-key-1";
  REQUIRE(a.registry.Register(first).ok());
  RegisterArgs rebuild = ArgsBy(1000, "op", "build-on-b");
  rebuild.content_id = "cache-key-1";
  SECTION("no peer has it: refused, nothing bound") {
    auto out = b.registry.Register(rebuild);
    REQUIRE(out.status().code() == absl::StatusCode::kNotFound);
    CHECK_THAT(std::string(out.status().message()),
               Catch::Contains("could not fetch from a peer"));
    CHECK(b.registry.Lookup({"op", Platform::kCpu}) == nullptr);
  }
  SECTION("a peer serves other bytes: refused as DATA_LOSS") {
    etcd.modules[Sha256Digest("build-on-a")] = "tampered";
    auto out = b.registry.Register(rebuild);
    REQUIRE(out.status().code() == absl::StatusCode::kDataLoss);
    CHECK_THAT(std::string(out.status().message()),
               Catch::Contains("not the binding's"));
    CHECK(b.loader.files.count(Sha256Digest("tampered")) == 0);
  }
  SECTION("a peer serves it") {
    etcd.modules[Sha256Digest("build-on-a")] = "build-on-a";
    auto out = b.registry.Register(rebuild);
    REQUIRE(out.ok());
    CHECK_FALSE(out->created);
    CHECK(out->entry->module_digest == Sha256Digest("build-on-a"));
    CHECK(b.loader.files.count(Sha256Digest("build-on-a")) == 1);
    CHECK(b.loader.files.count(Sha256Digest("build-on-b")) == 0);
  }
}

TEST_CASE(
    "With the authority unreachable nothing is registered, known "
    "targets stay no-ops",
    "[cluster][mirror]") {
  FakeEtcd etcd;
  Host a(&etcd, "a");
  REQUIRE(a.registry.Register(ArgsBy(1000, "known", "k")).ok());
  etcd.up = false;
  auto out = a.registry.Register(ArgsBy(1000, "new", "n"));
  REQUIRE(out.status().code() == absl::StatusCode::kUnavailable);
  CHECK(a.registry.Lookup({"new", Platform::kCpu}) == nullptr);
  CHECK(a.log.entries.size() == 1);
  CHECK(a.loader.temps.empty());
  CHECK(a.loader.files.count(Sha256Digest("n")) == 0);
  auto known = a.registry.Register(ArgsBy(1000, "known", "k"));
  REQUIRE(known.ok());
  CHECK_FALSE(known->created);
  // Retirement needs the authority too.
  auto retired = a.registry.Retire("known", Platform::kCpu, {1000, 1000, 1});
  CHECK(retired.status().code() == absl::StatusCode::kUnavailable);
  CHECK(a.registry.Lookup({"known", Platform::kCpu}) != nullptr);
  etcd.up = true;
  CHECK(a.registry.Register(ArgsBy(1000, "new", "n")).ok());
  REQUIRE(a.registry.Retire("known", Platform::kCpu, {1000, 1000, 1}).ok());
  CHECK(etcd.bindings.count({"known", Platform::kCpu}) == 0);
}

TEST_CASE("A claim whose local commit fails is taken back",
          "[cluster][mirror]") {
  FakeEtcd etcd;
  Host a(&etcd, "a");
  a.log.fail = true;
  auto out = a.registry.Register(ArgsBy(1000, "op", "x"));
  REQUIRE(out.status().code() == absl::StatusCode::kInternal);
  CHECK(a.authority.unclaims == 1);
  CHECK(etcd.bindings.empty());
}

TEST_CASE("A module that is no handler never claims the name",
          "[cluster][mirror]") {
  FakeEtcd etcd;
  Host a(&etcd, "a");
  auto out = a.registry.Register(Args("op", "x", "NotAHandler"));
  REQUIRE(out.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(a.authority.claims == 0);
  CHECK(etcd.bindings.empty());
}

TEST_CASE(
    "Mirror replaces a conflicting local binding; Unmirror retires the "
    "same content only",
    "[cluster][mirror]") {
  FakeLoader loader;
  MemLog log;
  FakeEtcd etcd;
  FakeAuthority authority(&etcd, "here");
  RegistrationService registry(&loader, &log);
  ClusterMirror mirror(&registry.core(), &registry.reservations(),
                       &registry.replacement(), &authority);
  REQUIRE(registry.Register(ArgsBy(1000, "op", "local")).ok());
  TargetEntry cluster;
  cluster.key = {"op", Platform::kCpu};
  cluster.func_name = "Scale";
  cluster.content_id = Sha256Digest("remote");
  cluster.module_digest = Sha256Digest("remote");
  cluster.module_size = 6;
  cluster.host = "b";
  SECTION("bytes that are not the module are refused") {
    absl::Status st = mirror.Mirror(cluster, "other");
    CHECK(st.code() == absl::StatusCode::kDataLoss);
  }
  SECTION("the cluster's binding wins") {
    REQUIRE(mirror.Mirror(cluster, "remote").ok());
    EntryPtr now = registry.Lookup(cluster.key);
    REQUIRE(now != nullptr);
    CHECK(now->module_digest == Sha256Digest("remote"));
    CHECK(now->host == "b");
    REQUIRE(log.retirements.size() == 1);
    CHECK(log.retirements[0].module_digest == Sha256Digest("local"));
    // The replaced module is no longer stored.
    CHECK(loader.files == std::set<std::string>{Sha256Digest("remote")});
    CHECK(mirror.Mirror(cluster, "").ok());  // identical: nothing
    CHECK(log.entries.size() == 2);
    TargetEntry older = cluster;
    older.content_id = "something else";
    REQUIRE(mirror.Unmirror(older, "test").ok());
    CHECK(registry.Lookup(cluster.key) != nullptr);
    REQUIRE(mirror.Unmirror(cluster, "test").ok());
    CHECK(registry.Lookup(cluster.key) == nullptr);
    CHECK(log.retirements.size() == 2);
    CHECK(loader.files.empty());
  }
}

TEST_CASE(
    "replace=true in cluster mode swaps the next generation into the "
    "authority; other hosts mirror it as a replacement",
    "[cluster][mirror][replace]") {
  FakeEtcd etcd;
  Host a(&etcd, "a", Owner()), b(&etcd, "b", Owner());
  REQUIRE(a.registry.Register(ArgsBy(1000, "op", "aa")).ok());
  REQUIRE(b.registry.Register(ArgsBy(1000, "op", "aa")).ok());
  auto out = a.registry.Register(ReplaceBy(1000, "bb"));
  REQUIRE(out.ok());
  CHECK(out->entry->generation == 2);
  CHECK(out->entry->host == "a");
  const TargetKey key{"op", Platform::kCpu};
  const TargetEntry cluster = etcd.bindings.at(key);
  CHECK(cluster.generation == 2);
  CHECK(cluster.module_digest == Sha256Digest("bb"));
  REQUIRE(cluster.generations.size() == 2);
  CHECK(cluster.generations[1].handler_info.api_minor == 4);  // probed
  REQUIRE(a.log.entries.size() == 2);
  // b's watcher: a replacement, not a conflict (no retirement).
  REQUIRE(b.mirror.Mirror(cluster, "bb").ok());
  EntryPtr on_b = b.registry.Lookup(key);
  CHECK(on_b->generation == 2);
  CHECK(on_b->module_digest == Sha256Digest("bb"));
  CHECK(on_b->generations.size() == 2);
  CHECK(on_b->host == "a");
  CHECK(b.log.retirements.empty());
  REQUIRE(b.log.entries.size() == 2);
  CHECK(b.log.entries[1].generation == 2);
  CHECK(b.loader.files.count(Sha256Digest("aa")) == 1);  // generation 1's
  CHECK(b.loader.files.count(Sha256Digest("bb")) == 1);
  // An earlier generation (a stale event) changes nothing.
  REQUIRE(a.registry.Register(ReplaceBy(1000, "cc")).ok());
  TargetEntry second = cluster;
  REQUIRE(a.mirror.Mirror(second, "").ok());
  CHECK(a.registry.Lookup(key)->generation == 3);
  CHECK(a.log.entries.size() == 3);
  CHECK(a.log.retirements.empty());
  // The same generation again is a no-op.
  REQUIRE(b.mirror.Mirror(cluster, "").ok());
  CHECK(b.log.entries.size() == 2);
}

TEST_CASE(
    "A replacement another host made first wins: the later one is refused, "
    "nothing of it kept",
    "[cluster][mirror][replace]") {
  FakeEtcd etcd;
  Host a(&etcd, "a", Owner()), b(&etcd, "b", Owner());
  REQUIRE(a.registry.Register(ArgsBy(1000, "op", "aa")).ok());
  REQUIRE(b.registry.Register(ArgsBy(1000, "op", "aa")).ok());
  REQUIRE(a.registry.Register(ReplaceBy(1000, "bb")).ok());
  // b has not mirrored generation 2 yet: its compare-and-swap fails.
  auto lost = b.registry.Register(ReplaceBy(1000, "cc"));
  REQUIRE(lost.status().code() == absl::StatusCode::kAborted);
  CHECK(std::string(lost.status().message()) ==
        "generation 2 was made on host a");
  const TargetKey key{"op", Platform::kCpu};
  CHECK(b.registry.Lookup(key)->generation == 1);
  CHECK(b.registry.refused() == 1);
  CHECK(b.log.entries.size() == 1);
  CHECK(b.loader.files.count(Sha256Digest("cc")) == 0);
  CHECK(b.loader.temps.empty());
  CHECK(etcd.bindings.at(key).module_digest == Sha256Digest("bb"));
  // Once b has caught up, its replacement is generation 3.
  REQUIRE(b.mirror.Mirror(etcd.bindings.at(key), "bb").ok());
  auto retry = b.registry.Register(ReplaceBy(1000, "cc"));
  REQUIRE(retry.ok());
  CHECK(retry->entry->generation == 3);
  CHECK(etcd.bindings.at(key).host == "b");
  CHECK(etcd.bindings.at(key).generation == 3);
}

TEST_CASE(
    "A replacement on a host without the local entry swaps the cluster's "
    "binding; an unreachable authority refuses it",
    "[cluster][mirror][replace]") {
  FakeEtcd etcd;
  Host a(&etcd, "a", Owner()), b(&etcd, "b", Owner());
  REQUIRE(a.registry.Register(ArgsBy(1000, "op", "aa")).ok());
  const TargetKey key{"op", Platform::kCpu};
  SECTION("reachable") {
    auto out = b.registry.Register(ReplaceBy(1000, "bb"));
    REQUIRE(out.ok());
    CHECK(out->entry->generation == 2);
    CHECK(etcd.bindings.at(key).generation == 2);
    CHECK(etcd.bindings.at(key).host == "b");
  }
  SECTION("unreachable") {
    etcd.up = false;
    auto out = a.registry.Register(ReplaceBy(1000, "bb"));
    REQUIRE(out.status().code() == absl::StatusCode::kUnavailable);
    CHECK(a.registry.Lookup(key)->generation == 1);
    CHECK(a.log.entries.size() == 1);
    CHECK(a.loader.files.count(Sha256Digest("bb")) == 0);
    CHECK(etcd.bindings.at(key).generation == 1);
  }
}

TEST_CASE(
    "A replacement whose answer was lost (or whose journal failed) after the "
    "authority applied it is completed by its retry",
    "[cluster][mirror][replace]") {
  FakeEtcd etcd;
  Host a(&etcd, "a", Owner());
  REQUIRE(a.registry.Register(ArgsBy(1000, "op", "aa")).ok());
  const TargetKey key{"op", Platform::kCpu};
  etcd.lose_answer = true;
  auto lost = a.registry.Register(ReplaceBy(1000, "bb"));
  REQUIRE(lost.status().code() == absl::StatusCode::kUnavailable);
  CHECK(a.registry.Lookup(key)->generation == 1);
  CHECK(etcd.bindings.at(key).generation == 2);
  auto retry = a.registry.Register(ReplaceBy(1000, "bb"));
  REQUIRE(retry.ok());
  CHECK(retry->entry->generation == 2);
  CHECK(a.log.entries.size() == 2);
  CHECK(etcd.bindings.at(key).generation == 2);
  // The same when the local journal failed after the swap.
  a.log.fail = true;
  auto unjournaled = a.registry.Register(ReplaceBy(1000, "cc"));
  REQUIRE(unjournaled.status().code() == absl::StatusCode::kInternal);
  CHECK(a.registry.Lookup(key)->generation == 2);
  CHECK(etcd.bindings.at(key).generation == 3);
  a.log.fail = false;
  auto completed = a.registry.Register(ReplaceBy(1000, "cc"));
  REQUIRE(completed.ok());
  CHECK(completed->entry->generation == 3);
  CHECK(a.loader.files.count(Sha256Digest("cc")) == 1);
}

TEST_CASE("An earlier generation's module is stored only with its bytes",
          "[cluster][mirror][replace]") {
  FakeLoader loader;
  MemLog log;
  FakeEtcd etcd;
  FakeAuthority authority(&etcd, "here");
  RegistrationService registry(&loader, &log);
  ClusterMirror mirror(&registry.core(), &registry.reservations(),
                       &registry.replacement(), &authority);
  absl::Status st = mirror.StoreModule(Sha256Digest("old"), "other");
  CHECK(st.code() == absl::StatusCode::kDataLoss);
  CHECK(std::string(st.message()) ==
        absl::StrCat("bytes offered as module ", Sha256Digest("old"),
                     " have digest ", Sha256Digest("other"), "; refused"));
  CHECK(loader.files.empty());
  CHECK(loader.temps.empty());
  REQUIRE(mirror.StoreModule(Sha256Digest("old"), "old").ok());
  CHECK(loader.files.count(Sha256Digest("old")) == 1);
  REQUIRE(mirror.StoreModule(Sha256Digest("old"), "old").ok());  // again
  CHECK(log.entries.empty());
}

TEST_CASE(
    "A higher generation of another owner's target is a conflict, as any "
    "other binding",
    "[cluster][mirror][replace]") {
  FakeLoader loader;
  MemLog log;
  FakeEtcd etcd;
  FakeAuthority authority(&etcd, "here");
  RegistrationService registry(&loader, &log, Owner());
  ClusterMirror mirror(&registry.core(), &registry.reservations(),
                       &registry.replacement(), &authority);
  REQUIRE(registry.Register(ArgsBy(1000, "op", "aa")).ok());
  TargetEntry cluster = *registry.Lookup({"op", Platform::kCpu});
  cluster.registered_by.uid = 1001;
  cluster.generation = 2;
  cluster.content_id = cluster.module_digest = Sha256Digest("bb");
  REQUIRE(mirror.Mirror(cluster, "bb").ok());
  REQUIRE(log.retirements.size() == 1);  // the conflict's
  CHECK(log.retirements[0].module_digest == Sha256Digest("aa"));
  CHECK(registry.Lookup(cluster.key)->registered_by.uid == 1001);
}

std::string HostName() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

TEST_CASE(
    "A replacement returns once the other hosts acknowledged it, and names "
    "their processes that did not switch",
    "[cluster][mirror][replace]") {
  FakeEtcd etcd;
  RegistryLimits limits = Owner();
  limits.replace_timeout = absl::Seconds(4);
  Host a(&etcd, "a", limits), b(&etcd, "b", limits), c(&etcd, "c", limits);
  etcd.live = {"a", "b", "c"};
  const TargetKey key{"op", Platform::kCpu};
  REQUIRE(a.registry.Register(ArgsBy(1000, "op", "aa")).ok());
  for (Host* h : {&b, &c}) {
    REQUIRE(h->mirror.Mirror(etcd.bindings.at(key), "aa").ok());
  }
  // b and c mirror it meanwhile (the module is in their store).
  auto mirror = [&] {
    for (Host* h : {&b, &c}) {
      REQUIRE(h->mirror.Mirror(etcd.bindings.at(key), "").ok());
    }
  };
  etcd.while_waiting = mirror;
  auto done = a.registry.Register(ReplaceBy(1000, "bb"));
  REQUIRE(done.ok());
  CHECK(etcd.acks["op"]["b"].generation == 2);
  CHECK(etcd.acks["op"]["c"].generation == 2);
  CHECK(etcd.acks["op"].count("a") == 0);  // the replacing host's own
  CHECK(a.registry.replaces().done == 1);
  // The other hosts get replace_timeout and the grace to report.
  CHECK(a.authority.ack_budget > absl::Seconds(4));
  CHECK(a.authority.ack_budget <= absl::Seconds(4) + kPeerAckGrace);
  // Laggards here and on b are named in one message, each with its host.
  a.repointer.laggards = {{PeerCred{1000, 1000, 4242}, false, 2, ""}};
  b.repointer.laggards = {{PeerCred{1001, 1001, 4300}, true, 2, "stuck"}};
  etcd.while_waiting = mirror;
  auto late = a.registry.Register(ReplaceBy(1000, "cc"));
  REQUIRE(late.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(late.status().message()) ==
        "target \"op\" (cpu) is now generation 3, but these processes did "
        "not switch to it within replace_timeout (4 s): pid 4242 " +
            UserName(1000) + " host " + HostName() +
            " (isolated, runs generation 2); pid 4300 " + UserName(1001) +
            " host b (local, runs generation 2: stuck). They run generation "
            "2 until they switch or exit; `kregctl show op` shows what each "
            "runs. A stopped process (SIGSTOP) switches when it continues.");
  CHECK(etcd.acks["op"]["b"].laggards.size() == 1);
  CHECK(a.registry.replaces().timeout == 1);
  // Processes and hosts in one message; etcd out of reach.
  CHECK(LaggardsMessage(*a.registry.Lookup(key),
                        {{PeerCred{1000, 1000, 4242}, false, 2, ""}},
                        {{"b", ""}, {"", "etcd is down"}}, absl::Seconds(4)) ==
        "target \"op\" (cpu) is now generation 3, but these processes did "
        "not switch to it within replace_timeout (4 s): pid 4242 " +
            UserName(1000) + " host " + HostName() +
            " (isolated, runs generation 2). They run generation 2 until they "
            "switch or exit; `kregctl show op` shows what each runs. A "
            "stopped process (SIGSTOP) switches when it continues. Also: host "
            "b did not report whether its processes switched within "
            "replace_timeout (4 s) (its kregd may be stopped, stuck or cut "
            "off from etcd); whether processes on the other hosts switched is "
            "unknown: etcd is down. `kregctl show op` on a host shows what "
            "its processes run.");
  CHECK(a.registry.Lookup(key)->generation == 3);
}

TEST_CASE(
    "A host that does not report, or cannot take the generation, is named",
    "[cluster][mirror][replace]") {
  FakeEtcd etcd;
  Host a(&etcd, "a", Owner()), b(&etcd, "b", Owner()), c(&etcd, "c", Owner());
  etcd.live = {"a", "b", "c"};
  const TargetKey key{"op", Platform::kCpu};
  REQUIRE(a.registry.Register(ArgsBy(1000, "op", "aa")).ok());
  for (Host* h : {&b, &c}) {
    REQUIRE(h->mirror.Mirror(etcd.bindings.at(key), "aa").ok());
  }
  c.oracle.bound["op"] = {77, 78};
  // b says nothing; c could not fetch the module, and pids 77 and 78 hold
  // generation 1 there.
  etcd.while_waiting = [&] {
    c.mirror.MirrorFailed(etcd.bindings.at(key),
                          "its module could not be fetched: no peer");
  };
  auto late = a.registry.Register(ReplaceBy(1000, "bb"));
  REQUIRE(late.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(late.status().message()) ==
        "target \"op\" (cpu) is now generation 2, but host b did not report "
        "whether its processes switched within replace_timeout (10 s) (its "
        "kregd may be stopped, stuck or cut off from etcd); host c could not "
        "switch its processes: it could not take generation 2 (its module "
        "could not be fetched: no peer), so its processes pid 77, 78 keep "
        "generation 1. `kregctl show op` on a host shows what its processes "
        "run.");
  CHECK(a.registry.Lookup(key)->generation == 2);
  CHECK(a.registry.replaces().timeout == 1);
  // Without holders there, c's failure holds nothing back; b reports.
  c.oracle.bound.clear();
  etcd.while_waiting = [&] {
    c.mirror.MirrorFailed(etcd.bindings.at(key), "no peer");
    REQUIRE(b.mirror.Mirror(etcd.bindings.at(key), "").ok());
  };
  REQUIRE(a.registry.Register(ReplaceBy(1000, "cc")).ok());
  CHECK(etcd.acks["op"]["c"].error.empty());
  // A host that left the cluster is not waited for; a generation 1 is never
  // acknowledged.
  etcd.live = {"a", "c"};
  etcd.while_waiting = [&] {
    c.mirror.MirrorFailed(etcd.bindings.at(key), "no peer");
  };
  REQUIRE(a.registry.Register(ReplaceBy(1000, "dd")).ok());
  REQUIRE(a.registry.Register(ArgsBy(1000, "fresh", "ee")).ok());
  REQUIRE(
      b.mirror.Mirror(etcd.bindings.at({"fresh", Platform::kCpu}), "ee").ok());
  CHECK(etcd.acks.count("fresh") == 0);
}

}  // namespace
}  // namespace kreg
