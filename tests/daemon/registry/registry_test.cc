#include "daemon/registry/registry.h"

#include <algorithm>
#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "daemon/store/module_store.h"
#include "tests/daemon/registry/registry_fakes.h"

namespace kreg {
namespace {

TEST_CASE("Register creates, then is an idempotent no-op", "[registry]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  auto first = registry.Register(Args("my_op", "aa"));
  REQUIRE(first.ok());
  CHECK(first->created);
  CHECK(first->entry->content_id == Sha256Digest("aa"));
  CHECK(first->entry->content_id.size() == 7 + 64);
  auto again = registry.Register(Args("my_op", "aa"));
  REQUIRE(again.ok());
  CHECK_FALSE(again->created);
  CHECK(loader.loads == 1);
  CHECK(log.entries.size() == 1);
  // Stored once, under the digest of its bytes; the no-op stores nothing.
  REQUIRE(loader.stored.size() == 1);
  CHECK(loader.stored[0] == Sha256Digest("aa"));
}

TEST_CASE("Register refuses new content under an existing name", "[registry]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  REQUIRE(registry.Register(Args("my_op", "aa")).ok());
  auto again = registry.Register(Args("my_op", "bb"));
  REQUIRE(again.status().code() == absl::StatusCode::kFailedPrecondition);
  std::string msg(again.status().message());
  CHECK_THAT(msg, Catch::Contains("\"my_op\""));
  CHECK_THAT(msg, Catch::Contains(Sha256Digest("aa")));
  CHECK_THAT(msg, Catch::Contains(Sha256Digest("bb")));
  CHECK_THAT(msg, Catch::Contains("distinct target name"));
  CHECK_THAT(msg, !Catch::Contains("replace=true"));
  CHECK(log.entries.size() == 1);
  CHECK(registry.refused() == 1);
}

TEST_CASE("Register refuses a different function under the same content",
          "[registry]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  REQUIRE(registry.Register(Args("my_op", "aa", "Scale")).ok());
  auto other = registry.Register(Args("my_op", "aa", "AddMul"));
  REQUIRE(other.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(other.status().message()),
             Catch::Contains("function \"AddMul\""));
}

TEST_CASE("content_id decides identity when given", "[registry]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  RegisterArgs a = Args("op", "build-1 bytes");
  a.content_id = "cache:123";
  REQUIRE(registry.Register(a).ok());
  RegisterArgs rebuilt = Args("op", "build-2 bytes differ");
  rebuilt.content_id = "cache:123";
  auto same = registry.Register(rebuilt);
  REQUIRE(same.ok());
  CHECK_FALSE(same->created);
  rebuilt.content_id = "cache:456";
  auto changed = registry.Register(rebuilt);
  CHECK(changed.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(changed.status().message()),
             Catch::Contains("cache:123") && Catch::Contains("cache:456"));
}

TEST_CASE("A content_id change over identical bytes says only it differs",
          "[registry]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  RegisterArgs a = Args("op", "same bytes");
  a.content_id = "cache:/tmp/build-1";
  REQUIRE(registry.Register(a).ok());
  a.content_id = "cache:/tmp/build-2";
  auto again = registry.Register(a);
  REQUIRE(again.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(again.status().message()),
             Catch::Contains("refusing to re-point it") &&
                 Catch::Contains("The module bytes are identical (" +
                                 Sha256Digest("same bytes") +
                                 "): only the content_id differs") &&
                 Catch::Contains("computed from paths"));
  // Other bytes under another content_id: no such hint.
  RegisterArgs other = Args("op", "other bytes");
  other.content_id = "cache:/tmp/build-3";
  CHECK_THAT(std::string(registry.Register(other).status().message()),
             !Catch::Contains("only the content_id differs"));
}

TEST_CASE("One name carries a CPU and a CUDA implementation", "[registry]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  REQUIRE(registry.Register(Args("op", "cpu", "Scale", Platform::kCpu)).ok());
  auto cuda = registry.Register(Args("op", "gpu", "Scale", Platform::kCuda));
  REQUIRE(cuda.ok());
  CHECK(cuda->created);
  CHECK(registry.Find("op").size() == 2);
}

TEST_CASE("A probe failure registers nothing", "[registry]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  auto bad = registry.Register(Args("op", "aa", "NotAHandler"));
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(registry.Lookup({"op", Platform::kCpu}) == nullptr);
  CHECK(log.entries.empty());
}

TEST_CASE("A journal failure registers nothing", "[registry]") {
  FakeLoader loader;
  MemLog log;
  log.fail = true;
  Registry registry(&loader, &log);
  auto st = registry.Register(Args("op", "aa"));
  CHECK(st.status().code() == absl::StatusCode::kInternal);
  CHECK(registry.Lookup({"op", Platform::kCpu}) == nullptr);
}

TEST_CASE("N concurrent identical registrations load once", "[registry]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  std::atomic<int> ok{0}, created{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 32; ++i) {
    threads.emplace_back([&] {
      auto r = registry.Register(Args("op", "aa"));
      if (r.ok()) ok++;
      if (r.ok() && r->created) created++;
    });
  }
  for (auto& t : threads) t.join();
  CHECK(ok == 32);
  CHECK(created == 1);
  CHECK(loader.loads == 1);
  CHECK(log.entries.size() == 1);
}

TEST_CASE("N concurrent conflicting registrations have one winner",
          "[registry]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  std::atomic<int> ok{0}, refused{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 32; ++i) {
    threads.emplace_back([&, i] {
      auto r = registry.Register(Args("op", "content-" + std::to_string(i)));
      if (r.ok()) ok++;
      if (r.status().code() == absl::StatusCode::kFailedPrecondition) {
        refused++;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(ok == 1);
  CHECK(refused == 31);
  CHECK(log.entries.size() == 1);
}

TEST_CASE("Restore keeps a name with a corrupt module reserved", "[registry]") {
  FakeLoader loader;
  MemLog log;
  loader.stored_ok = false;
  Registry registry(&loader, &log);
  TargetEntry e;
  e.key = {"op", Platform::kCpu};
  e.func_name = "Scale";
  e.content_id = Sha256Digest("aa");
  e.module_digest = Sha256Digest("aa");
  CHECK(registry.Restore(e).code() == absl::StatusCode::kDataLoss);
  EntryPtr kept = registry.Lookup(e.key);
  REQUIRE(kept != nullptr);
  CHECK_THAT(kept->unavailable, Catch::Contains("corrupt"));
  // Other content is still refused; the original bytes repair it.
  CHECK(registry.Register(Args("op", "bb")).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  auto repaired = registry.Register(Args("op", "aa"));
  REQUIRE(repaired.ok());
  CHECK(repaired->entry->unavailable.empty());
  CHECK(log.entries.empty());
}

TEST_CASE("Restore refuses a second journaled record re-pointing a name",
          "[registry]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  TargetEntry e;
  e.key = {"op", Platform::kCpu};
  e.func_name = "Scale";
  e.content_id = e.module_digest = Sha256Digest("aa");
  REQUIRE(registry.Restore(e).ok());
  TargetEntry other = e;
  other.content_id = other.module_digest = Sha256Digest("bb");
  CHECK(registry.Restore(other).code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(registry.Lookup(e.key)->content_id == Sha256Digest("aa"));
}

RegisterArgs InProcess(const std::string& name, const std::string& cid) {
  RegisterArgs a;
  a.key = {name, Platform::kCuda};
  a.func_name = "my_kernel";
  a.content_id = cid;
  a.kind = TargetKind::kInProcess;
  a.origin = "in-process:pid 7";
  a.peer = {1000, 1000, 7};
  return a;
}

TEST_CASE("In-process targets: idempotent, refused on change, nothing loaded",
          "[registry]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  auto first = registry.Register(InProcess("numba.k", "fp:1"));
  REQUIRE(first.ok());
  CHECK(first->created);
  CHECK(first->entry->kind == TargetKind::kInProcess);
  CHECK(first->entry->module_digest.empty());
  CHECK(first->entry->registered_by.pid == 7);
  auto again = registry.Register(InProcess("numba.k", "fp:1"));
  REQUIRE(again.ok());
  CHECK_FALSE(again->created);
  auto changed = registry.Register(InProcess("numba.k", "fp:2"));
  REQUIRE(changed.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(changed.status().message()),
             Catch::Contains("in-process content fp:1") &&
                 Catch::Contains("in-process content fp:2"));
  CHECK(loader.loads == 0);
  CHECK(log.entries.size() == 1);
}

TEST_CASE("A module cannot take over an in-process name, nor the reverse",
          "[registry]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  REQUIRE(registry.Register(InProcess("k", "fp:1")).ok());
  RegisterArgs module = Args("k", "bytes", "my_kernel", Platform::kCuda);
  module.content_id = "fp:1";
  CHECK(registry.Register(module).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  REQUIRE(registry.Register(Args("m", "bytes")).ok());
  RegisterArgs taken = InProcess("m", Sha256Digest("bytes"));
  taken.key.platform = Platform::kCpu;
  taken.func_name = "Scale";
  CHECK(registry.Register(taken).status().code() ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("Restore brings back in-process targets without loading",
          "[registry]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  TargetEntry e;
  e.key = {"k", Platform::kCuda};
  e.kind = TargetKind::kInProcess;
  e.func_name = "my_kernel";
  e.content_id = "fp:1";
  REQUIRE(registry.Restore(e).ok());
  CHECK(loader.loads == 0);
  CHECK(registry.Register(InProcess("k", "fp:2")).status().code() ==
        absl::StatusCode::kFailedPrecondition);
}

// --- content_id is a claim (DESIGN §2, content identity) -------------------

TEST_CASE("content_id: the same uid's rebuild with other bytes is a no-op",
          "[registry][content_id]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  RegisterArgs a = ArgsBy(1000, "op", "build-1");
  a.content_id = "cache:1";
  REQUIRE(registry.Register(a).ok());
  RegisterArgs rebuilt = ArgsBy(1000, "op", "build-2");
  rebuilt.content_id = "cache:1";
  auto same = registry.Register(rebuilt);
  REQUIRE(same.ok());
  CHECK_FALSE(same->created);
  CHECK(same->entry->module_digest == Sha256Digest("build-1"));
  CHECK(loader.stored.size() == 1);
}

TEST_CASE("content_id: another uid with other bytes is refused",
          "[registry][content_id]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  RegisterArgs owner = ArgsBy(1000, "demo", "the first user's module");
  owner.content_id = "cache:1";
  REQUIRE(registry.Register(owner).ok());
  RegisterArgs other = ArgsBy(1001, "demo", "the real module");
  other.content_id = "cache:1";
  auto refused = registry.Register(other);
  REQUIRE(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  std::string msg(refused.status().message());
  CHECK_THAT(msg, Catch::Contains("registered by uid 1000"));
  CHECK_THAT(msg, Catch::Contains("by uid 1001"));
  CHECK_THAT(msg, Catch::Contains(Sha256Digest("the first user's module")));
  CHECK_THAT(msg, Catch::Contains(Sha256Digest("the real module")));
  CHECK_THAT(msg, Catch::Contains("\"cache:1\""));
  CHECK_THAT(msg, Catch::Contains("distinct target name"));
  CHECK(registry.refused() == 1);
  CHECK(loader.stored.size() == 1);
  CHECK(log.entries.size() == 1);
}

TEST_CASE("A refusal names the uid, user and time of the holding registration",
          "[registry]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  // uid 0 has a passwd entry everywhere ("root"); 54321 (most likely) none.
  REQUIRE(registry.Register(ArgsBy(0, "held", "owner's module")).ok());
  auto other = registry.Register(ArgsBy(1001, "held", "another module"));
  REQUIRE(other.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(other.status().message()),
             Catch::Matches(".*is already registered \\(first registered by "
                            "uid 0 \\(root\\) since "
                            "20[0-9][0-9]-[01][0-9]-[0-3][0-9]T[0-2][0-9]:"
                            "[0-5][0-9]:[0-5][0-9]Z\\) with content .*"));
  REQUIRE(registry.Register(ArgsBy(54321, "nameless", "m1")).ok());
  auto again = registry.Register(ArgsBy(1001, "nameless", "m2"));
  CHECK_THAT(std::string(again.status().message()),
             Catch::Matches(".*\\(first registered by uid 54321 since 20.*Z\\) "
                            "with content .*"));
  // Same content_id, other bytes, other uid: the owner and time as well.
  RegisterArgs owner = ArgsBy(0, "cached", "owner build");
  owner.content_id = "cache:7";
  REQUIRE(registry.Register(owner).ok());
  RegisterArgs intruder = ArgsBy(1001, "cached", "other build");
  intruder.content_id = "cache:7";
  auto refused = registry.Register(intruder);
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Matches(".*\\(cpu\\) is registered by uid 0 \\(root\\) "
                            "since 20.*Z with content_id \"cache:7\".*"));
}

TEST_CASE("content_id: another uid with the same bytes is a no-op",
          "[registry][content_id]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  RegisterArgs owner = ArgsBy(1000, "demo", "module");
  owner.content_id = "cache:1";
  REQUIRE(registry.Register(owner).ok());
  RegisterArgs other = ArgsBy(1001, "demo", "module");
  other.content_id = "cache:1";
  auto same = registry.Register(other);
  REQUIRE(same.ok());
  CHECK_FALSE(same->created);
  // Without a content_id the digest is the identity: equal for anyone.
  auto plain_owner = registry.Register(ArgsBy(1000, "plain", "m"));
  REQUIRE(plain_owner.ok());
  auto plain_other = registry.Register(ArgsBy(1001, "plain", "m"));
  REQUIRE(plain_other.ok());
  CHECK_FALSE(plain_other->created);
}

TEST_CASE("content_id: a sha256: claim must be the module's digest",
          "[registry][content_id]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  const std::string real = Sha256Digest("real libdemo.so");
  RegisterArgs spoof = ArgsBy(1000, "demo", "other code");
  spoof.content_id = real;
  auto refused = registry.Register(spoof);
  REQUIRE(refused.status().code() == absl::StatusCode::kInvalidArgument);
  std::string msg(refused.status().message());
  CHECK_THAT(msg, Catch::Contains("\"" + real + "\""));
  CHECK_THAT(msg, Catch::Contains(Sha256Digest("other code")));
  CHECK_THAT(msg, Catch::Contains("must be the module's own digest"));
  CHECK(loader.stored.empty());
  CHECK(registry.Lookup({"demo", Platform::kCpu}) == nullptr);

  // The prefix is recognised in any case; a short claim is refused too.
  spoof.content_id = "SHA256:" + real.substr(7);
  CHECK(registry.Register(spoof).status().code() ==
        absl::StatusCode::kInvalidArgument);
  spoof.content_id = "sha256:abc";
  CHECK(registry.Register(spoof).status().code() ==
        absl::StatusCode::kInvalidArgument);

  RegisterArgs honest = ArgsBy(1000, "demo", "other code");
  honest.content_id = Sha256Digest("other code");
  auto ok = registry.Register(honest);
  REQUIRE(ok.ok());
  CHECK(ok->entry->content_id == honest.content_id);
  // The real module under the spoofed claim: the name is taken by other
  // content, refused as a change.
  RegisterArgs victim = ArgsBy(1001, "demo", "real libdemo.so");
  CHECK(registry.Register(victim).status().code() ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("content_id: in-process fingerprints are not module digests",
          "[registry][content_id]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  RegisterArgs a = InProcess("k", "sha256:fingerprint");
  REQUIRE(registry.Register(a).ok());
  a.peer.uid = 1001;
  auto other = registry.Register(a);
  REQUIRE(other.ok());
  CHECK_FALSE(other->created);
}

// --- decided under the lock, worked on outside it ---------------------------

TEST_CASE("A slow probe holds back only requests for its own name",
          "[registry][concurrency]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  absl::StatusOr<RegisterOutcome> slow, same, other;
  std::thread first(
      [&] { slow = registry.Register(Args("slow", "s", "Slow")); });
  loader.AwaitSlowProbes(1);
  // While that probe is stuck (up to the real probe's 20 s), other names
  // register, list and retire: none of it waits for the probe.
  for (int i = 0; i < 20; ++i) {
    auto r = registry.Register(Args("fast" + std::to_string(i), "f"));
    REQUIRE(r.ok());
    CHECK(r->created);
  }
  CHECK(registry.List().size() == 20);
  CHECK(registry.Lookup({"slow", Platform::kCpu}) == nullptr);
  REQUIRE(registry.Retire("fast0", std::nullopt, PeerCred{0, 0, 1}).ok());
  // Requests for the reserved name wait for it, then decide again.
  std::thread again(
      [&] { same = registry.Register(Args("slow", "s", "Slow")); });
  std::thread change(
      [&] { other = registry.Register(Args("slow", "t", "Slow")); });
  loader.OpenGate();
  first.join();
  again.join();
  change.join();
  REQUIRE(slow.ok());
  CHECK(slow->created);
  REQUIRE(same.ok());
  CHECK_FALSE(same->created);
  CHECK(other.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(registry.List().size() == 20);
  // The slow name's bytes were staged once: the identical request waited.
  CHECK(std::count(loader.stored.begin(), loader.stored.end(),
                   Sha256Digest("s")) == 1);
}

TEST_CASE("A registration in progress counts against its uid's limits",
          "[registry][concurrency][limits]") {
  FakeLoader loader;
  MemLog log;
  QuotaLimits limits;
  limits.max_registrations_per_uid = 1;
  Registry registry(&loader, &log, limits);
  absl::StatusOr<RegisterOutcome> slow;
  RegisterArgs slow_args = ArgsBy(1000, "slow", "s");
  slow_args.func_name = "Slow";
  std::thread first([&] { slow = registry.Register(slow_args); });
  loader.AwaitSlowProbes(1);
  auto second = registry.Register(ArgsBy(1000, "second", "x"));
  CHECK(second.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(second.status().message()),
             Catch::Contains("already has 1 registrations"));
  CHECK(registry
            .PrecheckUpload({"third", Platform::kCpu}, 10,
                            PeerCred{1000, 1000, 1})
            .code() == absl::StatusCode::kResourceExhausted);
  CHECK(registry.Register(ArgsBy(1001, "other uid", "y")).ok());
  loader.OpenGate();
  first.join();
  REQUIRE(slow.ok());
  CHECK(slow->created);
}

TEST_CASE("gc waits for a registration in progress and keeps its file",
          "[registry][concurrency][disk]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  REQUIRE(registry.Register(Args("old", "o")).ok());
  REQUIRE(registry.Retire("old", std::nullopt, PeerCred{0, 0, 1}).ok());
  absl::StatusOr<RegisterOutcome> slow;
  std::thread first(
      [&] { slow = registry.Register(Args("slow", "s", "Slow")); });
  loader.AwaitSlowProbes(1);
  absl::StatusOr<GcOutcome> gc;
  std::thread sweep([&] { gc = registry.CollectGarbage(PeerCred{0, 0, 1}); });
  loader.OpenGate();
  first.join();
  sweep.join();
  // Had the sweep run during the probe, the staged temp file would be gone
  // and the commit would fail.
  REQUIRE(slow.ok());
  REQUIRE(gc.ok());
  CHECK(loader.files == std::set<std::string>{Sha256Digest("s")});
}

// --- the store holds accepted modules only (DESIGN §2) ---------------------

TEST_CASE("A refused or failed registration leaves nothing in the store",
          "[registry][disk]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  SECTION("probe failure: the temp file is discarded, nothing committed") {
    CHECK(registry.Register(Args("op", "aa", "NotAHandler")).status().code() ==
          absl::StatusCode::kInvalidArgument);
    CHECK(loader.discarded == std::vector<std::string>{Sha256Digest("aa")});
  }
  SECTION("journal failure: the committed file is swept again") {
    log.fail = true;
    CHECK(registry.Register(Args("op", "aa")).status().code() ==
          absl::StatusCode::kInternal);
    CHECK(loader.sweeps == 1);
    CHECK(loader.files.empty());
  }
  SECTION("conflict: refused before anything is written") {
    REQUIRE(registry.Register(Args("op", "aa")).ok());
    CHECK(registry.Register(Args("op", "bb")).status().code() ==
          absl::StatusCode::kFailedPrecondition);
    CHECK(loader.stored.size() == 1);
    CHECK(loader.files == std::set<std::string>{Sha256Digest("aa")});
  }
  CHECK(loader.temps.empty());
  CHECK(loader.files.count(Sha256Digest("bb")) == 0);
}

TEST_CASE("A failure never removes a module another entry uses",
          "[registry][disk]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  REQUIRE(registry.Register(Args("a", "aa")).ok());
  log.fail = true;
  CHECK_FALSE(registry.Register(Args("b", "aa")).ok());
  CHECK(loader.discarded.empty());
  CHECK(loader.files == std::set<std::string>{Sha256Digest("aa")});
}

}  // namespace
}  // namespace kreg
