// Moves the live processes that have a target bound to its new generation
// (docs/replace.md, sections 3-5): consulted by Registry::Replace once the
// generation is committed.
#ifndef KREGD_DAEMON_REGISTRY_REPOINTER_H_
#define KREGD_DAEMON_REGISTRY_REPOINTER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "daemon/base/types.h"

namespace kreg {

// The largest acknowledgement frame kregd reads from a re-pointed process
// (an executor's ExecRepointAck, a shim's RepointAck on its watch
// connection: names, a generation and an error text). Both peers are
// untrusted; a longer frame is refused unread and breaks the connection.
constexpr uint32_t kMaxRepointAckBytes = 16u << 10;

// Implemented by the session layer: isolated holders through their
// executors, local holders through their shim. Thread-safe; must not call
// back into the registry.
class Repointer {
 public:
  virtual ~Repointer() = default;
  // A process that has the key bound and has not switched.
  struct Laggard {
    PeerCred peer;
    bool local = false;       // bound locally (else isolated)
    uint64_t generation = 0;  // the generation it still runs
    // Why it did not switch when it answered (e.g. its executor could not
    // load the module); empty: no answer in time.
    std::string why;
    // Its host in cluster mode, as the other hosts name it ("NAME
    // (ADDRESS)"); empty: this host.
    std::string host;
  };
  // Tells every live holder of `entry.key` to switch to `entry.generation`
  // (its module is in the store under `entry.module_digest`) and waits
  // until each acknowledged or `deadline` passed. Returns the holders that
  // did not switch, by pid; empty when all did (or none holds the key).
  virtual std::vector<Laggard> Repoint(const TargetEntry& entry,
                                       absl::Time deadline) = 0;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_REGISTRY_REPOINTER_H_
