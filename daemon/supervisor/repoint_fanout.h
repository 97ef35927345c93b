// Several Repointers behind one (docs/replace.md sections 3-5): isolated
// holders through their executors, local ones through their shims, asked at
// once under one deadline.
#ifndef KREGD_DAEMON_SUPERVISOR_REPOINT_FANOUT_H_
#define KREGD_DAEMON_SUPERVISOR_REPOINT_FANOUT_H_

#include <vector>

#include "daemon/registry/repointer.h"

namespace kreg {

// Add every part before the registry may call Repoint; then thread-safe.
class RepointFanout final : public Repointer {
 public:
  // `part` must outlive the fanout.
  void Add(Repointer* part) { parts_.push_back(part); }
  // Runs every part's Repoint concurrently with `deadline`; their laggards,
  // by pid.
  std::vector<Laggard> Repoint(const TargetEntry& entry,
                               absl::Time deadline) override;

 private:
  std::vector<Repointer*> parts_;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_SUPERVISOR_REPOINT_FANOUT_H_
