// Which live sessions have a target bound: consulted by Registry::Retire.
#ifndef KREGD_DAEMON_REGISTRY_BINDING_ORACLE_H_
#define KREGD_DAEMON_REGISTRY_BINDING_ORACLE_H_

#include <sys/types.h>

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
};

}  // namespace kreg

#endif  // KREGD_DAEMON_REGISTRY_BINDING_ORACLE_H_
