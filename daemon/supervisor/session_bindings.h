// Which live client sessions have which targets bound (registered through
// the session or resolved for calls): the BindingOracle that refuses to
// retire a name a running JAX process still uses.
#ifndef KREGD_DAEMON_SUPERVISOR_SESSION_BINDINGS_H_
#define KREGD_DAEMON_SUPERVISOR_SESSION_BINDINGS_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "daemon/base/types.h"
#include "daemon/registry/binding_oracle.h"

namespace kreg {

// Thread-safe; never calls into the registry.
class SessionBindings final : public BindingOracle {
 public:
  // `local`: the client's own process holds the module (DESIGN §11); a
  // session that holds a key both ways shows it as local. `generation`:
  // the one it resolved (docs/replace.md; 0: unknown); `pinned`: the
  // session asked for that generation (section 7) and keeps it. True when
  // the session holds `key` locally now and did not before.
  bool Add(uint64_t session_id, const PeerCred& peer, const TargetKey& key,
           bool local = false, uint32_t generation = 0, bool pinned = false);
  // The session ended: forget what it had bound.
  void RemoveSession(uint64_t session_id);
  std::vector<PeerCred> Holders(const TargetKey& key) override;
  std::vector<GenerationHold> GenerationHolds(const TargetKey& key) override;
  struct Bound {
    TargetKey key;
    bool local = false;
    uint32_t generation = 0;  // what it runs (docs/replace.md)
    bool pinned = false;      // a re-point leaves it at `generation`
  };
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
  absl::Mutex mu_;
  std::map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kreg

#endif  // KREGD_DAEMON_SUPERVISOR_SESSION_BINDINGS_H_
