// The Registry core's extension points (docs/design.md "The registry"): a
// feature attaches as an admission policy, a change policy, an install hook
// or a key binder, without editing the core.
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "tests/daemon/registry/registry_fakes.h"

namespace kreg {
namespace {

// Refuses names that start with "no.", once outside the lock and once
// under it; counts both.
struct PrefixPolicy : AdmissionPolicy {
  absl::Status Screen(const RegisterArgs& args,
                      AdmissionNote* note) const override {
    ++screened;
    note->groups = std::vector<gid_t>{77};
    return Refuse(args, "screen");
  }
  absl::Status Admit(const RegisterArgs& args,
                     const AdmissionNote& note) const override {
    ++admitted;
    seen_groups = note.groups.has_value() && (*note.groups)[0] == 77;
    return refuse_under_lock ? Refuse(args, "admit") : absl::OkStatus();
  }
  absl::Status Refuse(const RegisterArgs& args, const char* where) const {
    if (args.key.name.rfind("no.", 0) != 0) return absl::OkStatus();
    return absl::PermissionDeniedError(
        absl::StrCat("\"", args.key.name, "\" refused at ", where));
  }
  mutable int screened = 0, admitted = 0;
  mutable bool seen_groups = false;
  bool refuse_under_lock = false;
};

// Records the hook calls; `fail_at` makes that one fail.
struct RecordingHook : InstallHook {
  absl::Status Probed(const TargetEntry& e, const HandlerInfo&) override {
    return Step("probed " + e.key.name);
  }
  absl::Status Committing(TargetEntry* e, const TargetEntry* prev) override {
    e->host = "stamped";
    return Step("committing " + e->key.name + (prev ? " after" : ""));
  }
  void Committed(const TargetEntry& e) override {
    calls.push_back("committed " + e.key.name);
  }
  absl::Status Retiring(const TargetEntry& e) override {
    return Step("retiring " + e.key.name);
  }
  absl::Status Step(const std::string& what) {
    calls.push_back(what);
    if (what.rfind(fail_at, 0) == 0 && !fail_at.empty()) {
      return absl::UnavailableError("hook says no: " + what);
    }
    return absl::OkStatus();
  }
  std::vector<std::string> calls;
  std::string fail_at;
};

TEST_CASE("An admission policy is asked before the decision, and refuses",
          "[registry][extensions]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  PrefixPolicy policy;
  registry.AddAdmission(&policy);
  auto refused = registry.Register(ArgsBy(1000, "no.op", "aa"));
  REQUIRE(refused.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(refused.status().message() == "\"no.op\" refused at screen");
  CHECK(policy.admitted == 0);  // refused before the lock
  CHECK(registry.refused() == 1);
  CHECK(loader.stored.empty());

  REQUIRE(registry.Register(ArgsBy(1000, "ok.op", "aa")).ok());
  CHECK(policy.admitted == 1);
  CHECK(policy.seen_groups);  // Screen's look-ups reach Admit

  // A refusal under the lock (a policy that changed meanwhile) counts too.
  struct Late : PrefixPolicy {
    absl::Status Screen(const RegisterArgs&, AdmissionNote*) const override {
      return absl::OkStatus();
    }
  };
  Late late;
  late.refuse_under_lock = true;
  Registry other(&loader, &log);
  other.AddAdmission(&late);
  auto under = other.Register(ArgsBy(1000, "no.op", "bb"));
  REQUIRE(under.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(under.status().message() == "\"no.op\" refused at admit");
  CHECK(other.refused() == 1);
  CHECK(other.Lookup({"no.op", Platform::kCpu}) == nullptr);
}

TEST_CASE("Install hooks run around every install and retirement",
          "[registry][extensions]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  RecordingHook hook;
  registry.AddInstallHook(&hook);
  auto made = registry.Register(ArgsBy(1000, "op", "aa"));
  REQUIRE(made.ok());
  CHECK(made->entry->host == "stamped");  // Committing may fill fields in
  CHECK(log.entries.back().host == "stamped");
  CHECK(hook.calls ==
        std::vector<std::string>{"probed op", "committing op", "committed op"});
  REQUIRE(registry.Retire("op", Platform::kCpu, {1000, 1000, 5}).ok());
  CHECK(hook.calls.back() == "retiring op");

  SECTION("a failing Committing leaves nothing behind") {
    hook.fail_at = "committing";
    auto refused = registry.Register(ArgsBy(1000, "op2", "bb"));
    REQUIRE(refused.status().code() == absl::StatusCode::kUnavailable);
    CHECK(refused.status().message() == "hook says no: committing op2");
    CHECK(registry.Lookup({"op2", Platform::kCpu}) == nullptr);
    CHECK(log.entries.size() == 1);  // only "op"
  }
  SECTION("a failing Retiring keeps the entry") {
    REQUIRE(registry.Register(ArgsBy(1000, "op3", "cc")).ok());
    hook.fail_at = "retiring";
    auto kept = registry.Retire("op3", Platform::kCpu, {1000, 1000, 5});
    REQUIRE(kept.status().code() == absl::StatusCode::kUnavailable);
    CHECK(registry.Lookup({"op3", Platform::kCpu}) != nullptr);
    CHECK(log.retirements.size() == 1);  // only "op"
  }
}

TEST_CASE("A held key makes others wait; a declined hold holds nothing",
          "[registry][extensions]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  const TargetKey key{"op", Platform::kCpu};
  auto declined = registry.HoldKey(
      key, [](const EntryPtr& e, uid_t*, std::string*, uint64_t*) {
        CHECK(e == nullptr);
        return false;
      });
  CHECK(declined == nullptr);
  auto held = registry.HoldKey(
      key, [](const EntryPtr&, uid_t* uid, std::string* digest, uint64_t*) {
        *uid = 1000;
        *digest = "sha256:x";
        return true;
      });
  REQUIRE(held != nullptr);
  CHECK(registry.InProgress(key, "sha256:x"));
  CHECK_FALSE(registry.InProgress(key, "sha256:y"));
  held.reset();
  CHECK_FALSE(registry.InProgress(key, "sha256:x"));
  // Free again: a registration of the key goes through.
  CHECK(registry.Register(ArgsBy(1000, "op", "aa")).ok());
}

}  // namespace
}  // namespace kreg
