// Registry under `replace = "owner"` (docs/replace.md): generations.
#include <unistd.h>

#include <atomic>
#include <ctime>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "catch2/catch.hpp"
#include "daemon/registry/registry.h"
#include "daemon/store/module_store.h"
#include "tests/daemon/registry/registry_fakes.h"

namespace kreg {
namespace {

RegistryLimits Owner() {
  RegistryLimits limits;
  limits.replace_by_owner = true;
  return limits;
}

RegisterArgs ReplaceBy(uid_t uid, const std::string& bytes,
                       const std::string& func = "Scale") {
  RegisterArgs a = ArgsBy(uid, "my_op", bytes);
  a.func_name = func;
  a.replace = true;
  return a;
}

TEST_CASE("replace=true by the owner makes the next generation", "[replace]") {
  FakeLoader loader;
  MemLog log;
  RegistrationService registry(&loader, &log, Owner());
  REQUIRE(registry.Register(ArgsBy(1000, "my_op", "aa")).ok());
  auto second = registry.Register(ReplaceBy(1000, "bb"));
  REQUIRE(second.ok());
  CHECK(second->created);
  const TargetEntry& e = *registry.Lookup({"my_op", Platform::kCpu});
  CHECK(e.generation == 2);
  CHECK(e.module_digest == Sha256Digest("bb"));
  CHECK(e.registered_by.uid == 1000);
  REQUIRE(e.generations.size() == 2);
  CHECK(e.generations[0].generation == 1);
  CHECK(e.generations[0].module_digest == Sha256Digest("aa"));
  CHECK(e.generations[1].generation == 2);
  CHECK(e.generations[1].module_digest == Sha256Digest("bb"));
  CHECK(e.generations[1].by.uid == 1000);
  CHECK(e.generations[1].handler_info.api_minor == 4);
  // Journaled with both identities.
  REQUIRE(log.entries.size() == 2);
  CHECK(log.entries[1].generation == 2);
  CHECK(log.entries[1].generations.size() == 2);
  // The same content again is a no-op; other content a third generation.
  auto same = registry.Register(ReplaceBy(1000, "bb"));
  REQUIRE(same.ok());
  CHECK_FALSE(same->created);
  auto third = registry.Register(ReplaceBy(1000, "cc"));
  REQUIRE(third.ok());
  CHECK(third->entry->generation == 3);
  // No process holds generation 1 (there is no oracle): it is dropped; the
  // generation replaced stays.
  REQUIRE(third->entry->generations.size() == 2);
  CHECK(third->entry->generations[0].generation == 2);
  CHECK(log.entries.size() == 3);
  // Every live generation's module stays in the store.
  REQUIRE(registry.CollectGarbage({0, 0, 1}).ok());
  CHECK(loader.gc_keep ==
        std::set<std::string>{Sha256Digest("bb"), Sha256Digest("cc")});
}

TEST_CASE("a replacement keeps the generations live processes hold",
          "[replace][generations]") {
  FakeLoader loader;
  MemLog log;
  FakeOracle oracle;
  RegistrationService registry(&loader, &log, Owner());
  registry.SetBindingOracle(&oracle);
  REQUIRE(registry.Register(ArgsBy(1000, "my_op", "aa")).ok());
  // pid 50 pins generation 1; pid 51 follows the current one.
  oracle.holds["my_op"] = {{{1050, 0, 50}, 1, true}, {{1051, 0, 51}, 1}};
  REQUIRE(registry.Register(ReplaceBy(1000, "bb")).ok());
  oracle.holds["my_op"][1].generation = 2;  // 51 switched
  REQUIRE(registry.Register(ReplaceBy(1000, "cc")).ok());
  oracle.holds["my_op"][1].generation = 3;
  auto fourth = registry.Register(ReplaceBy(1000, "dd"));
  REQUIRE(fourth.ok());
  // 1 (pinned) and 3 (replaced) stay with 4; 2 is held by no one.
  std::vector<uint32_t> live;
  for (const Generation& g : fourth->entry->generations) {
    live.push_back(g.generation);
  }
  CHECK(live == std::vector<uint32_t>{1, 3, 4});
  CHECK(log.entries.back().generations.size() == 3);
  // Its module leaves the store with the sweep the replacement owed.
  CHECK(loader.files.count(Sha256Digest("bb")) == 0);
  CHECK(loader.files.count(Sha256Digest("aa")) == 1);
  CHECK(loader.files.count(Sha256Digest("cc")) == 1);
}

TEST_CASE(
    "a replacement past max_generations_per_target is refused naming the "
    "holders",
    "[replace][generations]") {
  FakeLoader loader;
  MemLog log;
  FakeOracle oracle;
  RegistryLimits limits = Owner();
  limits.max_generations_per_target = 3;
  RegistrationService registry(&loader, &log, limits);
  registry.SetBindingOracle(&oracle);
  REQUIRE(registry.Register(ArgsBy(1000, "my_op", "aa")).ok());
  oracle.holds["my_op"] = {{{1050, 0, 50}, 1, true}};
  REQUIRE(registry.Register(ReplaceBy(1000, "bb")).ok());
  oracle.holds["my_op"].push_back({{1051, 0, 51}, 2, true});
  oracle.holds["my_op"].push_back({{1052, 0, 52}, 2});  // a laggard
  REQUIRE(registry.Register(ReplaceBy(1000, "cc")).ok());
  const size_t staged = loader.stored.size();
  auto over = registry.Register(ReplaceBy(1000, "dd"));
  REQUIRE(over.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(over.status().message()) ==
        "cannot replace target \"my_op\" (cpu): it would have 4 live "
        "generations, over max_generations_per_target (3). Generation 3 is "
        "the current one, and 2 earlier generations are still held or "
        "pinned by live processes: generation 1 by pid 50 " +
            UserName(1050) + " (pinned); generation 2 by pid 51 " +
            UserName(1051) + " (pinned), pid 52 " + UserName(1052) +
            ". A generation is dropped once no process holds or pins it: "
            "let those processes exit (or bind the name without a "
            "generation to follow the current one), then replace again; or "
            "ask the operator to raise max_generations_per_target.");
  // Refused before anything was stored or journaled.
  CHECK(loader.stored.size() == staged);
  CHECK(log.entries.size() == 3);
  CHECK(registry.Lookup({"my_op", Platform::kCpu})->generation == 3);
  CHECK(registry.replaces().refused == 1);
  // Once the pin of generation 1 ends, the replacement goes through.
  oracle.holds["my_op"].erase(oracle.holds["my_op"].begin());
  auto now = registry.Register(ReplaceBy(1000, "dd"));
  REQUIRE(now.ok());
  CHECK(now->entry->generation == 4);
  CHECK(now->entry->generations.size() == 3);
}

TEST_CASE("root may replace another uid's target; the owner stays",
          "[replace]") {
  FakeLoader loader;
  MemLog log;
  RegistrationService registry(&loader, &log, Owner());
  REQUIRE(registry.Register(ArgsBy(1000, "my_op", "aa")).ok());
  auto replaced = registry.Register(ReplaceBy(0, "bb"));
  REQUIRE(replaced.ok());
  CHECK(replaced->entry->generation == 2);
  CHECK(replaced->entry->registered_by.uid == 1000);
  CHECK(replaced->entry->generations[1].by.uid == 0);
}

TEST_CASE("another uid's replace is refused naming the owner", "[replace]") {
  FakeLoader loader;
  MemLog log;
  RegistrationService registry(&loader, &log, Owner());
  REQUIRE(registry.Register(ArgsBy(1000, "my_op", "aa")).ok());
  auto refused = registry.Register(ReplaceBy(1001, "bb"));
  REQUIRE(refused.status().code() == absl::StatusCode::kPermissionDenied);
  std::string msg(refused.status().message());
  CHECK_THAT(msg, Catch::StartsWith("cannot replace target \"my_op\" (cpu): "
                                    "it is owned by " +
                                    UserName(1000) + " since "));
  CHECK_THAT(msg, Catch::EndsWith(
                      ", and only its owner or root may replace it (you are "
                      "uid 1001). Ask its owner, or register your build under "
                      "a distinct target name."));
  CHECK(log.entries.size() == 1);
  CHECK(registry.refused() == 1);
  CHECK(registry.replaces().refused == 1);
}

TEST_CASE("deny keeps today's refusal of replace=true, word for word",
          "[replace]") {
  FakeLoader loader;
  MemLog log;
  RegistrationService registry(&loader, &log);  // replace = "deny", the default
  REQUIRE(registry.Register(ArgsBy(1000, "my_op", "aa")).ok());
  auto refused = registry.Register(ReplaceBy(1000, "bb"));
  REQUIRE(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  const TargetEntry& e = *registry.Lookup({"my_op", Platform::kCpu});
  std::time_t t = static_cast<std::time_t>(e.registered_at_us / 1000000);
  struct tm tm;
  char when[32];
  REQUIRE(::gmtime_r(&t, &tm) != nullptr);
  REQUIRE(std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm) > 0);
  CHECK(std::string(refused.status().message()) ==
        "target \"my_op\" is already registered (first registered by " +
            UserName(1000) + " since " + when + ") with content " +
            Sha256Digest("aa") +
            ", function \"Scale\", platform cpu; refusing to re-point it to "
            "content " +
            Sha256Digest("bb") +
            ", function \"Scale\", platform cpu. XLA binds a handler into "
            "every compiled executable, so a live re-point can be neither "
            "performed nor verified. Register the rebuild under a distinct "
            "target name (a new name or a version prefix, e.g. "
            "\"my_op.v2\"). replace=true was requested, but it is reserved: "
            "a content change is refused whether or not it is set.");
  CHECK(log.entries.size() == 1);
}

TEST_CASE("under owner, a change without replace=true says how to replace",
          "[replace]") {
  FakeLoader loader;
  MemLog log;
  RegistrationService registry(&loader, &log, Owner());
  REQUIRE(registry.Register(ArgsBy(1000, "my_op", "aa")).ok());
  auto refused = registry.Register(ArgsBy(1000, "my_op", "bb"));
  REQUIRE(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(refused.status().message()),
             Catch::EndsWith("\"my_op.v2\"). This kregd lets a target's owner "
                             "(uid 1000) or root replace it in place: "
                             "register with replace=True to make the next "
                             "generation."));
}

std::string HostName() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

TEST_CASE(
    "a committed replacement re-points the holders within "
    "replace_timeout",
    "[replace]") {
  FakeLoader loader;
  MemLog log;
  FakeRepointer repointer;
  RegistrationService registry(&loader, &log, Owner());
  registry.SetRepointer(&repointer);
  REQUIRE(registry.Register(ArgsBy(1000, "my_op", "aa")).ok());
  CHECK(repointer.calls.empty());  // a first registration re-points nothing
  auto replaced = registry.Register(ReplaceBy(1000, "bb"));
  REQUIRE(replaced.ok());
  CHECK(replaced->entry->generation == 2);
  REQUIRE(repointer.calls.size() == 1);
  CHECK(repointer.calls[0] ==
        std::make_pair(std::string("my_op"), uint64_t{2}));
  CHECK(repointer.budget <= absl::Seconds(10));  // the default
  CHECK(repointer.budget > absl::ZeroDuration());
  // A no-op (the same content) re-points nothing.
  REQUIRE(registry.Register(ReplaceBy(1000, "bb")).ok());
  CHECK(repointer.calls.size() == 1);
  CHECK(registry.replaces().done == 1);
  CHECK(registry.replaces().timeout == 0);
  CHECK(registry.replaces().refused == 0);
}

TEST_CASE(
    "holders that do not switch make DEADLINE_EXCEEDED naming them; "
    "the generation stays",
    "[replace]") {
  FakeLoader loader;
  MemLog log;
  FakeRepointer repointer;
  RegistryLimits limits = Owner();
  limits.replace_timeout = absl::Seconds(3);
  RegistrationService registry(&loader, &log, limits);
  registry.SetRepointer(&repointer);
  REQUIRE(registry.Register(ArgsBy(1000, "my_op", "aa")).ok());
  repointer.laggards = {{PeerCred{1000, 1000, 4242}, /*local=*/false, 1, ""},
                        {PeerCred{1001, 1001, 4250}, /*local=*/true, 1,
                         "its executor could not load it"}};
  auto late = registry.Register(ReplaceBy(1000, "bb"));
  REQUIRE(late.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(late.status().message()) ==
        "target \"my_op\" (cpu) is now generation 2, but these processes did "
        "not switch to it within replace_timeout (3 s): pid 4242 " +
            UserName(1000) + " host " + HostName() +
            " (isolated, runs generation 1); pid 4250 " + UserName(1001) +
            " host " + HostName() +
            " (local, runs generation 1: its executor could not load it). "
            "They run generation 1 until they switch or exit; `kregctl show "
            "my_op` shows what each runs. A stopped process (SIGSTOP) "
            "switches when it continues.");
  CHECK(registry.Lookup({"my_op", Platform::kCpu})->generation == 2);
  CHECK(log.entries.size() == 2);
  CHECK(registry.replaces().timeout == 1);
  CHECK(registry.replaces().done == 0);
  // Holders behind by different generations are all named.
  repointer.laggards = {{PeerCred{1000, 1000, 7}, false, 1, ""},
                        {PeerCred{1000, 1000, 8}, false, 2, ""}};
  auto later = registry.Register(ReplaceBy(1000, "cc"));
  REQUIRE(later.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK_THAT(std::string(later.status().message()),
             Catch::Contains("They run generations 1, 2 until they switch"));
}

TEST_CASE("the name stays reserved until the re-point ends", "[replace]") {
  FakeLoader loader;
  MemLog log;
  FakeRepointer repointer;
  RegistrationService registry(&loader, &log, Owner());
  registry.SetRepointer(&repointer);
  REQUIRE(registry.Register(ArgsBy(1000, "my_op", "aa")).ok());
  std::atomic<bool> second_done{false};
  std::thread second;
  absl::StatusOr<RegisterOutcome> second_out;
  repointer.during = [&] {
    second = std::thread([&] {
      second_out = registry.Register(ReplaceBy(1000, "cc"));
      second_done.store(true);
    });
    // Other names are not held back meanwhile.
    REQUIRE(registry.Register(ArgsBy(1000, "other_op", "dd")).ok());
    absl::SleepFor(absl::Milliseconds(200));  // room for a wrong interleave
    CHECK_FALSE(second_done.load());
    CHECK(registry.Lookup({"my_op", Platform::kCpu})->generation == 2);
  };
  REQUIRE(registry.Register(ReplaceBy(1000, "bb")).ok());
  second.join();
  REQUIRE(second_out.ok());
  CHECK(second_out->entry->generation == 3);
  REQUIRE(repointer.calls.size() == 2);
  CHECK(repointer.calls[1].second == 3);
}

TEST_CASE("in-process targets cannot be replaced", "[replace]") {
  FakeLoader loader;
  MemLog log;
  RegistrationService registry(&loader, &log, Owner());
  REQUIRE(registry.Register(InProcessArgs("cb", "fp1")).ok());
  RegisterArgs change = InProcessArgs("cb", "fp2");
  change.replace = true;
  auto refused = registry.Register(change);
  REQUIRE(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(refused.status().message()) ==
        "cannot replace target \"cb\" (cuda): the registered target is an "
        "in-process callable (it runs inside its owner process, where kregd "
        "cannot re-point it); only modules can be replaced. Register it under "
        "a distinct target name.");
  RegisterArgs module = Args("cb", "aa", "Scale", Platform::kCuda);
  module.peer = {0, 0, 7};
  module.replace = true;
  auto over = registry.Register(module);
  REQUIRE(over.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(over.status().message()),
             Catch::Contains("the registered target is an in-process"));
  CHECK(log.entries.size() == 1);
}

TEST_CASE("a replacement with other FFI traits is refused naming both",
          "[replace]") {
  FakeLoader loader;
  MemLog log;
  RegistrationService registry(&loader, &log, Owner());
  REQUIRE(registry.Register(ArgsBy(1000, "my_op", "aa")).ok());
  auto refused = registry.Register(ReplaceBy(1000, "bb", "Traits1"));
  REQUIRE(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(refused.status().message()) ==
        "cannot replace target \"my_op\" (cpu) with function \"Traits1\" of "
        "module " +
            Sha256Digest("bb") +
            ": its XLA FFI metadata is not compatible with generation 1's "
            "(FFI API 0.4 -> 0.4, traits 0 -> 1); executables compiled "
            "against the current handler cannot call it. Build it against "
            "the same XLA FFI API major version with the same traits, or "
            "register it under a distinct target name.");
  CHECK(log.entries.size() == 1);
  CHECK(loader.discarded == std::vector<std::string>{Sha256Digest("bb")});
  CHECK(registry.Lookup({"my_op", Platform::kCpu})->generation == 1);
  // Another FFI API minor version is compatible.
  auto minor = registry.Register(ReplaceBy(1000, "cc", "Minor5"));
  REQUIRE(minor.ok());
  CHECK(minor->entry->handler_info.api_minor == 5);
}

TEST_CASE("every generation's module counts against the owner's store bytes",
          "[replace]") {
  FakeLoader loader;
  MemLog log;
  RegistryLimits limits = Owner();
  limits.max_registrations_per_uid = 1;  // a replacement is no new name
  limits.max_store_bytes_per_uid = 5;
  RegistrationService registry(&loader, &log, limits);
  REQUIRE(registry.Register(ArgsBy(1000, "my_op", "aa")).ok());
  REQUIRE(registry.Register(ReplaceBy(1000, "bb")).ok());
  auto over = registry.Register(ReplaceBy(1000, "ccc"));
  REQUIRE(over.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(over.status().message()) ==
        "cannot register target \"my_op\" (cpu): its 3-byte module would "
        "bring uid 1000's module store use to 7 bytes (now 4); the limit per "
        "uid is 5 bytes (max_store_bytes_per_uid); retire targets you no "
        "longer use (kregctl retire NAME) or ask the operator to raise the "
        "limit");
  CHECK(registry.Lookup({"my_op", Platform::kCpu})->generation == 2);
  // Back to generation 1's bytes: already stored, nothing more counted.
  REQUIRE(registry.Register(ReplaceBy(1000, "aa")).ok());
  CHECK(registry.Lookup({"my_op", Platform::kCpu})->generation == 3);
}

TEST_CASE("Restore brings back the last generation", "[replace]") {
  FakeLoader loader;
  MemLog log;
  {
    RegistrationService registry(&loader, &log, Owner());
    REQUIRE(registry.Register(ArgsBy(1000, "my_op", "aa")).ok());
    REQUIRE(registry.Register(ReplaceBy(1000, "bb")).ok());
  }
  Registry restarted(&loader, &log);
  REQUIRE(restarted.Restore(log.entries.back()).ok());
  EntryPtr e = restarted.Lookup({"my_op", Platform::kCpu});
  CHECK(e->generation == 2);
  CHECK(e->module_digest == Sha256Digest("bb"));
  // Under deny, the restarted registry refuses further changes as usual.
  auto refused = restarted.Register(ReplaceBy(1000, "cc"));
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("replace=true is reserved: refused with its own message",
          "[registry][replace]") {
  FakeLoader loader;
  MemLog log;
  RegistrationService registry(&loader, &log);
  REQUIRE(registry.Register(Args("my_op", "aa")).ok());
  RegisterArgs change = Args("my_op", "bb");
  change.replace = true;
  auto refused = registry.Register(change);
  REQUIRE(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("replace=true was requested, but it is reserved"));
  RegisterArgs same = Args("my_op", "aa");
  same.replace = true;
  auto noop = registry.Register(same);
  REQUIRE(noop.ok());
  CHECK_FALSE(noop->created);
}

}  // namespace
}  // namespace kreg
