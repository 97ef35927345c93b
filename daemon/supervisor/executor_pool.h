// The executors of kregd (DESIGN §8): which executor serves which client
// session, starting them on demand, supervising them, and turning an
// executor's death into a clear error for the calls it was running.
#ifndef KREGD_DAEMON_SUPERVISOR_EXECUTOR_POOL_H_
#define KREGD_DAEMON_SUPERVISOR_EXECUTOR_POOL_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"
#include "daemon/base/target_stats.h"
#include "daemon/base/types.h"
#include "daemon/supervisor/crash_ledger.h"
#include "daemon/supervisor/executor_process.h"
#include "daemon/supervisor/generation_stats.h"
#include "kreg/v1/executor.pb.h"

namespace kreg {

// How client sessions are grouped onto executors.
enum class Isolation {
  kUid,     // one executor per client uid, running as that uid (default)
  kClient,  // one executor per client process
  kShared,  // one executor for everybody
};
const char* IsolationName(Isolation isolation);

struct PoolOptions {
  Isolation isolation = Isolation::kUid;
  std::string binary;  // kregd-exec
  // Limits and switches every executor gets; the pool fills in the
  // credentials, group, parent pid and slots.
  v1::ExecInit init;
  // Sessions one executor serves at most.
  uint32_t slots = 256;
  // Kill an executor whose handler runs longer (0: never).
  int64_t launch_timeout_ms = 0;
  // Stop an executor that served no session for this long.
  int64_t idle_ms = 30000;
  std::chrono::milliseconds start_timeout{60000};
  // Starts executors; null: Executor::Start (kregd-exec processes). Tests
  // pass fakes.
  ExecutorLauncher launcher;
  // Re-adoption (DESIGN §12; adoption.h): each executor gets a fresh nonce
  // and its key under this secret (empty: executors cannot be re-adopted).
  // init carries the supervision socket and the settings digest.
  std::string adoption_secret;
};

// A session an executor offered along with itself (DESIGN §12), checked:
// the client's credentials come from its socket, the entries from this
// kregd's registry (null: that target is not registered now).
struct ReadoptedSession {
  uint64_t session_id = 0;  // this kregd's id for it
  uint32_t slot = 0;
  PeerCred peer;
  std::vector<std::pair<EntryPtr, uint32_t>> tokens;
};

// A live executor, for status.
struct ExecutorInfo {
  pid_t pid = 0;
  std::string group;
  uid_t uid = 0;
  gid_t gid = 0;
  int sessions = 0;
  uint64_t launches = 0;
};

// A client session bound to an executor slot, for `kregctl sessions`.
struct BoundSession {
  uint64_t session_id = 0;
  PeerCred peer;
  int64_t since_us = 0;  // bound at, microseconds since the Unix epoch
  pid_t executor_pid = 0;
  std::string executor;  // the executor's group
  // As the executor reports them (untrusted; arena clamped to the limit).
  uint64_t launches = 0;
  uint64_t arena_bytes = 0;
  uint64_t states = 0;  // call-site states (handler bundles) it holds
};

struct PoolCounters {
  uint64_t launches = 0;
  uint64_t launch_errors = 0;
  uint64_t executors_started = 0;
  uint64_t executor_crashes = 0;
  // Broker frames kregd refused to read (over the size limit); each ended
  // its session.
  uint64_t broker_messages_refused = 0;
};

// Thread-safe. One mutex (mu_) guards the groups and counters; it is never
// held across a process start, a wait, the crash ledger (whose sink writes
// the journal) or a log line about a dead executor: Wait decides blame
// (crash_blame.h) from a copy taken under mu_ and publishes the result.
struct ExecutorGroup;

class ExecutorPool {
 public:
  // One executor and its sessions (executor_group.h).
  using Group = ExecutorGroup;

  // A client session bound to an executor.
  struct Binding {
    std::shared_ptr<Group> group;
    uint32_t slot = 0;
    PeerCred peer;
    UniqueFd broker;  // kregd's end of the session's broker socket
  };

  // `ledger` must outlive the pool.
  ExecutorPool(PoolOptions options, CrashLedger* ledger);
  ~ExecutorPool();  // Shutdown()
  ExecutorPool(const ExecutorPool&) = delete;
  ExecutorPool& operator=(const ExecutorPool&) = delete;

  // Finds or starts the executor for `peer` and hands it `client_fd` (the
  // client's session socket; the caller keeps its own descriptor).
  // UNAVAILABLE when the executor cannot be started, RESOURCE_EXHAUSTED
  // when it serves `slots` sessions already.
  absl::StatusOr<Binding> Bind(uint64_t session_id, int client_fd,
                               const PeerCred& peer);
  // Takes over an executor an earlier kregd left running, with its
  // sessions in their slots: one Binding per session, in order (the
  // caller sets each one's broker). It serves new sessions of its group
  // unless this kregd already has an executor for that group (then it only
  // serves its own until they close). FAILED_PRECONDITION when its
  // sessions do not belong to `group` under this kregd's isolation (it
  // should be drained), ALREADY_EXISTS when this kregd supervises that pid
  // already, INVALID_ARGUMENT for two sessions in one slot or a slot out
  // of range, UNAVAILABLE while shutting down.
  // `confirm` is called once everything is checked, before a Bind can
  // find the executor (readopt_listener.h); false from it: UNAVAILABLE.
  absl::StatusOr<std::vector<Binding>> Readopt(
      std::unique_ptr<ExecutorProcess> exec, const std::string& group,
      const std::vector<ReadoptedSession>& sessions,
      const std::function<bool()>& confirm);
  // The token the executor writes to the status page while `entry` runs:
  // one per generation (GenerationId) and executor.
  uint32_t TokenFor(const Binding& binding, EntryPtr entry);
  // The session ended normally.
  void Release(Binding* binding);
  // The executor closed the broker socket without ending the session:
  // waits (bounded; kills an executor that lingers) until it is gone and
  // returns the error for this session's call in flight: the crash of the
  // handler it ran (INTERNAL), or ABORTED when another session's handler
  // crashed the executor while this one's ran; else, when
  // `request_pending` (the client sent a request the executor never read)
  // and the executor ended unplanned, what ended it; OK otherwise (an idle
  // session: the client reconnects quietly).
  absl::Status AwaitCrash(Binding* binding, bool request_pending = false);
  // The executor of `binding` sent a broker frame kregd refused: counts it
  // (PoolCounters::broker_messages_refused). Returns that executor's pid.
  pid_t CountRefusedBrokerMessage(const Binding& binding);

  // Re-pointing (docs/replace.md section 3): sends `repoint` with
  // `module_fd` attached (unless it is -1: a late look for acks) to every
  // live executor serving one of `sessions`, each with its token for
  // `entry`, the generation `repoint` names (null with -1), then waits for
  // each one's ack until `deadline`. Per session served: its executor's
  // answer (OK: switched; isolated_repointer.cc). Sessions no live executor
  // serves are left out.
  std::map<uint64_t, absl::Status> Repoint(const std::set<uint64_t>& sessions,
                                           const v1::ExecRepoint& repoint,
                                           const EntryPtr& entry, int module_fd,
                                           absl::Time deadline);

  std::vector<ExecutorInfo> List() const;
  PoolCounters counters() const;
  // Shutdown() left the executors serving their sessions (orphan_timeout
  // > 0, DESIGN §12): brokers must not end their clients' connections, and
  // the pool must outlive the threads still waiting for those executors.
  bool leaving() const { return leaving_.load(); }
  // Every session bound to a live executor.
  std::vector<BoundSession> Sessions() const;
  // Launch statistics per generation (GenerationId order), from every
  // executor's status page (only for targets that executor's own sessions
  // resolved: a row is credited through the token kregd gave it, never
  // through what the page says) plus the totals of executors already
  // reaped.
  std::vector<TargetStatsRow> TargetStatsSnapshot() const;
  const PoolOptions& options() const { return options_; }
  // Stops every executor and the supervisor. Idempotent.
  void Shutdown();

 private:
  absl::StatusOr<std::shared_ptr<Group>> Start(const std::string& key,
                                               const PeerCred& peer);
  // Puts a started or re-adopted group in the pool and starts its waiter.
  void Admit(const std::shared_ptr<Group>& g)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reaps `group`'s executor (its own thread), then decides who is blamed,
  // records counted crashes, sets the group's crash texts and `blamed`.
  void Wait(std::shared_ptr<Group> group);
  // Wait's parts. Death: what blame needs, copied out under mu_ by Detach,
  // which takes the group out of the pool (no Bind takes its slots from
  // then on). Blame: decided, crashes recorded (the ledger's sink writes
  // the journal) and texts formatted without mu_. Publish: the texts and
  // counts under mu_, then `blamed` (what AwaitCrash waits for).
  struct Death;
  void Detach(const std::shared_ptr<Group>& g, Death* d);
  std::map<uint32_t, absl::Status> Blame(const Death& d,
                                         size_t* crashes_counted);
  void Publish(Group* g, const Death& d,
               const std::map<uint32_t, absl::Status>& texts,
               size_t crashes_counted);
  void Supervise();
  std::string GroupKey(const PeerCred& peer) const;
  // Runs `fn` on the spawner thread and waits for it. Executors are started
  // from that one long-lived thread because the kernel delivers an
  // executor's parent-death signal (set with orphan_timeout = 0) when the
  // *thread* that forked it exits.
  // False (and `fn` not run) once the pool is shutting down.
  bool OnSpawner(const std::function<void()>& fn);
  void SpawnerLoop();

  const PoolOptions options_;
  CrashLedger* const ledger_;
  absl::Mutex start_mu_;  // one executor start at a time
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Group>> groups_ ABSL_GUARDED_BY(mu_);
  struct Waiter {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  PoolCounters dead_counters_ ABSL_GUARDED_BY(mu_);
  uint64_t broker_messages_refused_ ABSL_GUARDED_BY(mu_) = 0;
  // Started and not yet reaped (groups_ drops an idle executor when it asks
  // it to stop; its counters count until it is reaped).
  std::set<std::shared_ptr<Group>> unreaped_ ABSL_GUARDED_BY(mu_);
  // What reaped executors counted, per generation.
  std::map<GenerationId, TargetStatsRow> dead_stats_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Shutdown() left the executors running for their sessions.
  std::atomic<bool> leaving_{false};
  absl::CondVar changed_;
  std::thread supervisor_;
  absl::Mutex spawn_q_mu_;
  std::deque<std::function<void()>> spawn_q_ ABSL_GUARDED_BY(spawn_q_mu_);
  bool spawner_stop_ ABSL_GUARDED_BY(spawn_q_mu_) = false;
  std::thread spawner_;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_SUPERVISOR_EXECUTOR_POOL_H_
