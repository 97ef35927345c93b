// Which live client sessions have which targets bound (registered through
// the session or resolved for calls): the BindingOracle that refuses to
// retire a name a running JAX process still uses.
#ifndef KREGD_DAEMON_SUPERVISOR_SESSION_BINDINGS_H_
#define KREGD_DAEMON_SUPERVISOR_SESSION_BINDINGS_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "daemon/base/types.h"
#include "daemon/registry/binding_oracle.h"

namespace kreg {

// The start time of process `pid` (/proc/PID/stat field 22, clock ticks
// since boot), which tells it from a later process that reuses its pid; 0
// when there is no such process.
uint64_t ProcessStartTime(pid_t pid);

// Thread-safe; never calls into the registry.
class SessionBindings final : public BindingOracle {
 public:
  // `start_time`: ProcessStartTime, or a fake in tests.
  explicit SessionBindings(
      std::function<uint64_t(pid_t)> start_time = ProcessStartTime)
      : start_time_(std::move(start_time)) {}
  // Process `peer.pid` registered `key` and its registration matched
  // `generation` (created or a no-op): it holds that content for the rest
  // of its life (DESIGN §14 rule 1), whatever becomes of the connection it
  // registered on.
  void RecordRegistration(const PeerCred& peer, const TargetKey& key,
                          uint32_t generation);
  // `local`: the client's own process holds the module (DESIGN §11); a
  // session that holds a key both ways shows it as local. `generation`:
  // the one it resolved (docs/replace.md; 0: unknown); `pinned`: the
  // session asked for that generation (section 7) and keeps it.
  // `registered`: the generation the process's registration matched
  // (created or a no-op), which it holds for its content (DESIGN §14 rule
  // 1; 0: it binds by name and follows the owner). True when the session
  // holds `key` locally now and did not before.
  bool Add(uint64_t session_id, const PeerCred& peer, const TargetKey& key,
           bool local = false, uint32_t generation = 0, bool pinned = false,
           uint32_t registered = 0);
  // The session ended: forget what it had bound.
  void RemoveSession(uint64_t session_id);
  std::vector<PeerCred> Holders(const TargetKey& key) override;
  std::vector<GenerationHold> GenerationHolds(const TargetKey& key) override;
  struct Bound {
    TargetKey key;
    bool local = false;
    uint32_t generation = 0;  // what it runs (docs/replace.md)
    bool pinned = false;      // a re-point leaves it at `generation`
    // Held for its content: the generation its process registered (0:
    // bound by name). See FollowedGeneration.
    uint32_t registered = 0;
  };
  // The generation process `pid` registered `key` at (RecordRegistration,
  // or a live session's `registered`; the latest); 0 when it registered
  // none.
  uint32_t RegisteredBy(pid_t pid, const TargetKey& key);
  // At most this many processes' registrations are remembered beyond their
  // connections; past it, those of ended processes are dropped first.
  static constexpr size_t kMaxRegistrations = 1u << 16;
  // The live sessions that hold `key`, by session id.
  std::map<uint64_t, std::pair<PeerCred, Bound>> HoldersOf(
      const TargetKey& key);
  // The session acknowledged (or resolved) `generation` of `key`.
  void SetGeneration(uint64_t session_id, const TargetKey& key,
                     uint32_t generation);
  // What the live sessions of process `pid` hold locally.
  std::vector<Bound> LocalOf(pid_t pid);
  // What each live session has bound, by session id.
  std::map<uint64_t, std::vector<Bound>> Snapshot();
  // Live sessions that hold at least one target locally.
  size_t LocalSessions();

 private:
  struct Session {
    PeerCred peer;
    std::map<TargetKey, Bound> keys;
  };
  struct Registration {
    uint64_t start_time = 0;  // of the process, when it registered
    uint32_t generation = 0;
  };
  const std::function<uint64_t(pid_t)> start_time_;
  absl::Mutex mu_;
  std::map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<pid_t, TargetKey>, Registration> registrations_
      ABSL_GUARDED_BY(mu_);
};

// The generation of `entry` that a holder of uid `uid` runs (DESIGN §14
// rule 1, docs/replace.md "Who switches"). Bound by name (`held.registered`
// 0): the current one. Pinned: its pin. Held for its content: the
// generation it registered, moved on through each later generation that
// its own uid or root made, up to the first that another uid made (the
// owner's replacement never reaches another uid's registering process).
uint32_t FollowedGeneration(const TargetEntry& entry,
                            const SessionBindings::Bound& held, uid_t uid);

}  // namespace kreg

#endif  // KREGD_DAEMON_SUPERVISOR_SESSION_BINDINGS_H_
