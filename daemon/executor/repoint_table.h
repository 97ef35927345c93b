// The generations kregd re-pointed targets to in one executor
// (docs/replace.md, section 3).
#ifndef KREGD_DAEMON_EXECUTOR_REPOINT_TABLE_H_
#define KREGD_DAEMON_EXECUTOR_REPOINT_TABLE_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "daemon/base/types.h"

namespace kreg {

// Written by the executor's main thread when kregd re-points a target
// (after the new module is loaded and its handler resolved), read by the
// sessions' HandlerTables at the start of each launch: a call boundary. A
// launch that already took its handler finishes on it. Thread-safe; the
// handlers belong to the executor's ModuleCache, which never unloads.
class RepointTable {
 public:
  struct Handler {
    uint32_t generation = 0;
    void* handler = nullptr;
    uint32_t token = 0;  // kregd's token for the generation (its stats row)
    // The sessions holding the target for its content that switch too
    // (ExecRepoint.content_sessions, sorted).
    std::vector<uint64_t> content_sessions;
    bool Switches(uint64_t session_id) const {
      return std::binary_search(content_sessions.begin(),
                                content_sessions.end(), session_id);
    }
  };

  RepointTable() = default;
  RepointTable(const RepointTable&) = delete;
  RepointTable& operator=(const RepointTable&) = delete;

  // Launches that look `key` up from now on get `handler` and count in the
  // stats row of `token`. False (and no change) when `key` is at
  // `generation` or a later one already.
  bool Set(const TargetKey& key, uint32_t generation, void* handler,
           uint32_t token, std::vector<uint64_t> content_sessions = {});
  // What `key` was last re-pointed to; nullopt when never.
  std::optional<Handler> Find(const TargetKey& key) const;
  // Counts the Sets that changed something: a reader that saw the same
  // epoch before has nothing to update.
  uint64_t epoch() const { return epoch_.load(std::memory_order_acquire); }

 private:
  mutable absl::Mutex mu_;
  std::map<TargetKey, Handler> handlers_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> epoch_{0};
};

}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_REPOINT_TABLE_H_
