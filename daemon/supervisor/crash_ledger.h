// Crash counts and quarantine of targets (DESIGN §8, crash containment).
#ifndef KREGD_DAEMON_SUPERVISOR_CRASH_LEDGER_H_
#define KREGD_DAEMON_SUPERVISOR_CRASH_LEDGER_H_

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "daemon/base/types.h"

namespace kreg {

struct CrashPolicy {
  int max_crashes = 3;     // quarantined at this many crashes ...
  int64_t window_s = 600;  // ... within this many seconds
};

// Thread-safe. Crash counts are in memory only (a restart forgets them);
// quarantines survive a restart when a sink records them (kregd: the
// journal) and Restore brings them back at start.
class CrashLedger {
 public:
  // Told each time a row becomes quarantined (`quarantined` true) or is
  // lifted (false), after the change, without the ledger's lock held.
  using QuarantineSink =
      std::function<void(const CrashRecord& row, bool quarantined)>;

  explicit CrashLedger(CrashPolicy policy) : policy_(policy) {}

  // Before the ledger is shared with other threads.
  void SetSink(QuarantineSink sink) { sink_ = std::move(sink); }
  // A quarantined row recorded before a restart (not told to the sink).
  void Restore(const CrashRecord& row);

  // Counts one crash of `key` in a call of `uid` at `now_s` (unix seconds).
  // Returns the row after the update.
  CrashRecord Record(const TargetKey& key, uid_t uid, const std::string& reason,
                     int64_t now_s);
  // The row when `key` is quarantined for `uid`.
  std::optional<CrashRecord> Quarantined(const TargetKey& key, uid_t uid) const;
  // Lifts the quarantine of `name` (every platform when `platform` is
  // empty; every uid when `uid` is empty) and resets its counts. Returns
  // the rows lifted.
  std::vector<CrashRecord> Unquarantine(const std::string& name,
                                        std::optional<Platform> platform,
                                        std::optional<uid_t> uid);
  // Every row of `name` (all names when empty).
  std::vector<CrashRecord> Rows(const std::string& name = "") const;
  const CrashPolicy& policy() const { return policy_; }

 private:
  struct Row {
    CrashRecord record;
    std::deque<int64_t> times;  // within the window
  };
  using Key = std::tuple<std::string, int, uid_t>;
  static Key KeyOf(const TargetKey& key, uid_t uid) {
    return {key.name, static_cast<int>(key.platform), uid};
  }

  const CrashPolicy policy_;
  QuarantineSink sink_;
  mutable absl::Mutex mu_;
  std::map<Key, Row> rows_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kreg

#endif  // KREGD_DAEMON_SUPERVISOR_CRASH_LEDGER_H_
