// The per-uid account every front door of kregd charges before it spends
// (DESIGN §14 rule 2): one mechanism, in one place, for what a uid may hold
// at once — connections of each kind, calls in flight, upload bytes (by
// announced size, sparse or not) and CPU-heavy work. A charge over the
// uid's limit is refused with RESOURCE_EXHAUSTED naming the resource, the
// uid, the limit, what the uid holds and the config key that raises it;
// other uids keep their share. The operator guide's table "Per-uid limits"
// lists every resource with its default. Thread-safe.
//
//   absl::StatusOr<UidAccount::Charge> c =
//       account.Take(peer.uid, UidResource::kControlConnections, 1);
//   if (!c.ok()) return c.status();   // nothing was spent
//   ...                               // held until `c` is destroyed
#ifndef KREGD_DAEMON_BASE_UID_ACCOUNT_H_
#define KREGD_DAEMON_BASE_UID_ACCOUNT_H_

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kreg {

enum class UidResource : int {
  kGrpcConnections = 0,  // max_grpc_connections_per_uid
  kGrpcCalls,            // max_grpc_calls_per_uid
  kSessions,             // max_sessions_per_uid
  kControlConnections,   // max_control_connections_per_uid
  kUploadBytes,          // max_upload_bytes_per_uid
  kHeavyWork,            // max_heavy_work_per_uid
  kPendingConnections,   // max_pending_connections_per_uid
  kWatchConnections,     // max_watch_connections_per_uid
  kStates,               // max_states_per_uid (handler bundles' states)
  kCount,
};

// What a resource is called in messages and which config key limits it.
struct UidResourceInfo {
  const char* what;   // plural noun: "control connections"
  const char* key;    // "max_control_connections_per_uid"
  const char* unit;   // "" or " bytes"
  const char* label;  // the metric label: "control_connections"
};
const UidResourceInfo& InfoOf(UidResource r);

// Per-uid limits; 0 means unlimited.
using UidLimits =
    std::array<uint64_t, static_cast<size_t>(UidResource::kCount)>;

class UidAccount {
 public:
  // What one request holds of one resource of one uid; given back when
  // destroyed (or Release()d). Movable, not copyable. The account must
  // outlive it.
  class Charge {
   public:
    Charge() = default;
    ~Charge() { Release(); }
    Charge(Charge&& o) noexcept;
    Charge& operator=(Charge&& o) noexcept;
    Charge(const Charge&) = delete;
    Charge& operator=(const Charge&) = delete;
    void Release();
    uint64_t amount() const { return amount_; }

   private:
    friend class UidAccount;
    Charge(UidAccount* a, uid_t uid, UidResource r, uint64_t amount)
        : account_(a), uid_(uid), resource_(r), amount_(amount) {}
    UidAccount* account_ = nullptr;
    uid_t uid_ = 0;
    UidResource resource_ = UidResource::kSessions;
    uint64_t amount_ = 0;
  };

  explicit UidAccount(const UidLimits& limits) : limits_(limits) {}
  UidAccount(const UidAccount&) = delete;
  UidAccount& operator=(const UidAccount&) = delete;

  // Charges `amount` of `r` to `uid`, or RESOURCE_EXHAUSTED (nothing
  // charged) when that would take the uid over its limit: "uid 1000 holds
  // 64 control connections already; 1 more would exceed its limit of 64
  // (max_control_connections_per_uid) ...".
  absl::StatusOr<Charge> Take(uid_t uid, UidResource r, uint64_t amount);
  // The same, but waits for the uid's other charges to be given back until
  // `deadline` (then the refusal above): for work a uid queues behind its
  // own (CPU-heavy work), never behind another uid's.
  absl::StatusOr<Charge> TakeWithin(uid_t uid, UidResource r, uint64_t amount,
                                    absl::Time deadline);

  // Charges `amount` of `r` to `uid` without the limit check: for what the
  // uid holds already and nothing can refuse (the states of a re-adopted
  // executor's sessions, DESIGN §12). The uid may end over its limit; its
  // next Take is refused until it is back under.
  Charge Keep(uid_t uid, UidResource r, uint64_t amount);

  // What `uid` holds of `r` now.
  uint64_t Held(uid_t uid, UidResource r);
  // Everything held now, by uid and resource (only what is above zero):
  // the metric kregd_uid_held (operator guide, "Per-uid limits").
  struct Holding {
    uid_t uid;
    UidResource resource;
    uint64_t held;
  };
  std::vector<Holding> Snapshot();
  uint64_t limit(UidResource r) const {
    return limits_[static_cast<size_t>(r)];
  }

 private:
  bool Fits(uid_t uid, UidResource r, uint64_t amount)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Refusal(uid_t uid, UidResource r, uint64_t amount)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Give(uid_t uid, UidResource r, uint64_t amount);
  struct Want {
    UidAccount* account;
    uid_t uid;
    UidResource r;
    uint64_t amount;
  };
  static bool WantFits(Want* w);

  const UidLimits limits_;
  absl::Mutex mu_;
  // (uid, resource) -> held; entries at 0 are erased.
  std::map<std::pair<uid_t, int>, uint64_t> held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kreg

#endif  // KREGD_DAEMON_BASE_UID_ACCOUNT_H_
