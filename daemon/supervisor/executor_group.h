// ExecutorPool's record of one executor and the sessions bound to it
// (private to executor_pool*.cc and the repointer).
#ifndef KREGD_DAEMON_SUPERVISOR_EXECUTOR_GROUP_H_
#define KREGD_DAEMON_SUPERVISOR_EXECUTOR_GROUP_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/base/types.h"
#include "daemon/supervisor/executor_process.h"
#include "daemon/supervisor/generation_stats.h"

namespace kreg {

// Who holds one slot of an executor.
struct SlotInfo {
  uint64_t session_id = 0;
  PeerCred peer;
  int64_t since_us = 0;
};

struct ExecutorGroup {
  std::string key;
  std::string name;  // "uid 1000", "pid 42 (uid 1000)", "shared"
  uid_t uid = 0;
  gid_t gid = 0;
  std::unique_ptr<ExecutorProcess> exec;
  // Guarded by the pool's mu_.
  std::vector<bool> used;
  std::vector<uid_t> slot_uid;
  std::vector<SlotInfo> slot_info;
  int sessions = 0;
  int64_t idle_since_ms = 0;
  std::vector<EntryPtr> resolved;  // token - 1 -> entry
  bool stop_requested = false;
  // Reaped: out of the pool; stop_requested and killed_because no longer
  // change.
  bool dead = false;
  std::string killed_because;  // why kregd killed it (logged when it did)
  // After dead: crash_text and death_note are in place (the pool's Wait
  // decides blame and records crashes between the two, without mu_).
  bool blamed = false;
  // Per slot, the error of the call that was running when the executor
  // died (crash_blame.h): INTERNAL for the crashing call, ABORTED for a
  // call another session's crash interrupted (the client may re-run it).
  std::map<uint32_t, absl::Status> crash_text;
  // An unplanned end: "kregd executor pid N (group) ended: <how>", for the
  // sessions that had a request in flight but no handler running.
  std::string death_note;
};

// Adds the stats rows of `g`'s status page to `out`, row t crediting the
// generation of the entry kregd resolved as token t for this executor (rows
// past what kregd handed out are never read). The pool's mu_ must be held.
void AddGroupStats(const ExecutorGroup& g,
                   std::map<GenerationId, TargetStatsRow>* out);
// The token of `entry`'s generation in `resolved` (an executor's tokens),
// a new one when it has none. The pool's mu_ must be held.
uint32_t TokenIn(std::vector<EntryPtr>* resolved, EntryPtr entry);

}  // namespace kreg

#endif  // KREGD_DAEMON_SUPERVISOR_EXECUTOR_GROUP_H_
