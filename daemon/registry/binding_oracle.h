// Which live sessions have a target bound: consulted by Registry::Retire.
#ifndef KREGD_DAEMON_REGISTRY_BINDING_ORACLE_H_
#define KREGD_DAEMON_REGISTRY_BINDING_ORACLE_H_

#include <sys/types.h>

#include <cstdint>
#include <vector>

#include "daemon/base/types.h"

namespace kreg {

// Implemented by the session layer (a target is bound once a session has
// resolved it for calls). Must be thread-safe and must not call back into
// the registry. Without an oracle the registry assumes nothing is bound.
class BindingOracle {
 public:
  virtual ~BindingOracle() = default;
  // The processes (pid, uid) of the live sessions that have `key` bound,
  // by pid; empty when none.
  virtual std::vector<PeerCred> Holders(const TargetKey& key) = 0;
  // A live process's hold on a generation of a key (docs/replace.md).
  struct GenerationHold {
    PeerCred peer;
    uint32_t generation = 0;  // 0: unknown (taken for the current one)
    bool pinned = false;      // a re-point leaves it at `generation`
  };
  // What the live sessions that hold `key` run, by pid. The default: none
  // known (every earlier generation is dropped at the next replacement).
  virtual std::vector<GenerationHold> GenerationHolds(const TargetKey& key) {
    (void)key;
    return {};
  }
};

}  // namespace kreg

#endif  // KREGD_DAEMON_REGISTRY_BINDING_ORACLE_H_
