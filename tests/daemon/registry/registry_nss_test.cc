// Registry: user and group lookups (NSS, slow on hosts that ask LDAP) run
// without the registry's lock, so one registration waiting on a lookup
// holds back no other. This binary interposes getpwuid_r: a lookup of
// kSlowUid waits until the test opens the gate.
#include <dlfcn.h>
#include <pwd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "absl/synchronization/notification.h"
#include "catch2/catch.hpp"
#include "tests/daemon/registry/registry_fakes.h"

namespace {

constexpr uid_t kSlowUid = 4321;
std::atomic<bool> g_looking_up{false};
absl::Notification* g_gate = nullptr;

}  // namespace

extern "C" int getpwuid_r(uid_t uid, struct passwd* pw, char* buf, size_t len,
                          struct passwd** out) {
  using Fn = int (*)(uid_t, struct passwd*, char*, size_t, struct passwd**);
  static const Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "getpwuid_r"));
  if (uid == kSlowUid && g_gate != nullptr) {
    g_looking_up = true;
    g_gate->WaitForNotification();
  }
  return real(uid, pw, buf, len, out);
}

namespace kreg {
namespace {

// Runs `slow` (a registration that looks up kSlowUid) on a thread; once it
// waits in the lookup, another uid registers another name: that must end
// while the lookup still waits. Returns the slow registration's status.
absl::Status WhileALookupWaits(RegistrationService* registry,
                               std::function<absl::Status()> slow) {
  absl::Notification gate;
  g_gate = &gate;
  g_looking_up = false;
  std::future<absl::Status> waiting = std::async(std::launch::async, slow);
  while (!g_looking_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::future<bool> other = std::async(std::launch::async, [registry] {
    return registry->Register(ArgsBy(1002, "other.op", "cc")).ok();
  });
  // Not a timing bound: under the lock this would never end; 60 s only
  // turns that hang into a failure.
  const bool ended =
      other.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  CHECK(ended);
  CHECK(waiting.wait_for(std::chrono::seconds(0)) != std::future_status::ready);
  gate.Notify();
  absl::Status s = waiting.get();
  CHECK(other.get());
  g_gate = nullptr;
  return s;
}

TEST_CASE("A refusal naming the holder looks the name up outside the lock",
          "[registry][nss]") {
  FakeLoader loader;
  MemLog log;
  RegistrationService registry(&loader, &log);
  REQUIRE(registry.Register(ArgsBy(kSlowUid, "held.op", "aa")).ok());
  absl::Status refused = WhileALookupWaits(&registry, [&registry] {
    return registry.Register(ArgsBy(1001, "held.op", "bb")).status();
  });
  CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(refused.message()),
             Catch::Contains("first registered by uid 4321"));
}

TEST_CASE("A group reservation looks the caller's groups up outside the lock",
          "[registry][nss]") {
  FakeLoader loader;
  MemLog log;
  RegistrationService registry(&loader, &log);
  NameReservation r;
  r.pattern = "team.*";
  r.owner = 4242;
  r.group = true;
  REQUIRE(registry.Reserve(r, PeerCred{0, 0, 1}).ok());
  absl::Status refused = WhileALookupWaits(&registry, [&registry] {
    return registry.Register(ArgsBy(kSlowUid, "team.op", "bb")).status();
  });
  CHECK(refused.code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(std::string(refused.message()),
             Catch::Contains("uid 4321 is not in that group"));
}

}  // namespace
}  // namespace kreg
