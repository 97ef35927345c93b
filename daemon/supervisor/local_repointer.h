// Re-pointing local bindings (docs/replace.md section 4): the watch
// connections of client processes that hold replaceable targets locally,
// and the Repointer that sends them Repoint notices and waits for their
// RepointAcks.
#ifndef KREGD_DAEMON_SUPERVISOR_LOCAL_REPOINTER_H_
#define KREGD_DAEMON_SUPERVISOR_LOCAL_REPOINTER_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"
#include "daemon/base/types.h"
#include "daemon/base/uid_account.h"
#include "daemon/registry/repointer.h"
#include "kreg/v1/session.pb.h"

namespace kreg {

class LocalModuleCache;
class SessionBindings;

// Processes of one uid that may watch at once, by default
// (max_watch_connections_per_uid).
constexpr size_t kMaxWatchesPerUid = 256;

// Thread-safe; never calls into the registry.
class LocalRepointer final : public Repointer {
 public:
  // `bindings` says who holds a key locally; `modules` hands out the new
  // generation's sealed memfd. Both must outlive this.
  // Watch connections are charged to `account`'s
  // UidResource::kWatchConnections (kregd's per-uid account, which must
  // outlive this; null: an account of its own with max_watches_per_uid).
  LocalRepointer(SessionBindings* bindings, LocalModuleCache* modules,
                 size_t max_watches_per_uid = kMaxWatchesPerUid,
                 UidAccount* account = nullptr);

  // Control connection `session` of `peer` asks to become its process's
  // watch connection. FAILED_PRECONDITION when the process (by pid) has
  // one already; RESOURCE_EXHAUSTED when `peer.uid` has
  // max_watches_per_uid; both name the limit and the remedy.
  absl::Status Reserve(uint64_t session, const PeerCred& peer);
  // `session`'s WatchReply went out: its notices go to (a duplicate of)
  // `sock` from now on. Each target its process holds locally at a
  // generation older than `current(key)`'s (it resolved it before it
  // watched, or while its watch was closed) gets its notice now, by
  // `deadline`; a Repoint waiting for the process counts its ack.
  void Activate(uint64_t session, int sock,
                const std::function<EntryPtr(const TargetKey&)>& current,
                absl::Time deadline);
  // A RepointAck read on `session`'s watch connection.
  void Acked(uint64_t session, const v1::RepointAck& ack);
  // The watch connection ended (or was refused): forgotten; a notice
  // waiting for its ack fails.
  void Detach(uint64_t session);

  // Sends Repoint to every process that holds entry.key locally and waits
  // for their acks until `deadline`; a holder whose watch connection opens
  // meanwhile gets it then (Activate). A holder without an ack by then, or
  // whose ack is an error, is a laggard (the error is logged); a holder
  // that ended meanwhile, or whose binding is pinned (its ack says so), is
  // not.
  std::vector<Laggard> Repoint(const TargetEntry& entry,
                               absl::Time deadline) override;

 private:
  struct Watch {
    PeerCred peer;
    UidAccount::Charge charge;  // its uid's watch connection
    UniqueFd sock;              // kregd's duplicate; invalid until Activate
    absl::Mutex send_mu;        // one frame at a time
  };
  // One Repoint call's notices: by holder pid, the ack's status once it
  // came.
  struct Wait {
    TargetKey key;
    uint64_t generation = 0;
    std::map<pid_t, std::unique_ptr<absl::Status>> acks;
  };
  // Sends `w` (of `session`) the Repoint notice of `entry` with its
  // module, waiting no longer than `deadline` for room (then it closes the
  // connection: a frame may be half sent).
  absl::Status Notify(uint64_t session, const std::shared_ptr<Watch>& w,
                      const TargetEntry& entry, absl::Time deadline);
  // The processes that hold `entry.key` locally and switch to `entry`
  // (FollowedGeneration: not those holding another uid's generation for
  // its content), by pid, with the generation each resolved or
  // acknowledged last (0: unknown).
  std::map<pid_t, std::pair<PeerCred, uint32_t>> LocalHolders(
      const TargetEntry& entry);

  SessionBindings* const bindings_;
  LocalModuleCache* const modules_;
  std::unique_ptr<UidAccount> own_account_;  // unless given one
  UidAccount* const account_;
  absl::Mutex mu_;
  absl::CondVar cv_;  // an ack came or a watch ended
  std::map<uint64_t, std::shared_ptr<Watch>> watches_ ABSL_GUARDED_BY(mu_);
  std::vector<Wait*> waits_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kreg

#endif  // KREGD_DAEMON_SUPERVISOR_LOCAL_REPOINTER_H_
