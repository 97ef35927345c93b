// The per-instance states an executor holds for its clients' call sites
// (XLA FFI's State API out of process; docs/kernel-author-guide.md,
// "Handler bundles and state"): what a bundle's instantiate stage made,
// kept under a handle the client's forwarding handler holds as its own XLA
// state until XLA destroys the executable (ReleaseState) or the session
// that made it ends.
#ifndef KREGD_DAEMON_EXECUTOR_STATE_TABLE_H_
#define KREGD_DAEMON_EXECUTOR_STATE_TABLE_H_

#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/handler_spec.h"
#include "daemon/base/types.h"
#include "daemon/executor/ffi/ffi_host.h"

namespace kreg {

// What a call site's state was made by: the bundle's handlers (by stage)
// of the generation that ran its instantiate stage, and that generation's
// stats token. The state's later stages run these, not a newer
// generation's (docs/replace.md, "States across a replacement").
struct StateOwner {
  TargetKey key;
  std::array<void*, kNumHandlerStages> stages{};
  uint32_t token = 0;
};

// Owns the states of one executor process: each is owned by the session
// that instantiated it (destroyed, with its type's deleter, when released,
// when that session ends, and in the destructor) and usable by every
// session of the same client process (a client spreads its calls over a
// pool of sessions). Thread-safe; its mutex is never held while a handler
// or a released state's deleter runs (the destructor's deleters excepted).
class StateTable {
 public:
  // At most `max_per_session` states per owning session; 0: unbounded.
  explicit StateTable(uint64_t max_per_session);
  ~StateTable();
  StateTable(const StateTable&) = delete;
  StateTable& operator=(const StateTable&) = delete;

  // OK when session `session` may hold one more state; RESOURCE_EXHAUSTED
  // naming the limit (max_states_per_session) and what to do otherwise.
  // Checked before the instantiate stage runs.
  absl::Status CheckRoom(uint64_t session) const;
  // Keeps `state` (made by `owner` for session `session` of process `pid`)
  // and returns its handle (never 0). `gauge` (may be null; must outlive
  // the session's states) gets the session's count whenever it changes.
  // If it no longer fits, `state` is destroyed and CheckRoom's error
  // returned.
  // `uncharge` (may be empty) runs when the state is released by
  // Release (not when its session ends: kregd gives a closed session's
  // charges back itself), without the table's lock (it may make a round
  // trip to kregd); ReleaseSession of its session waits for it, so that it
  // never runs after that returned.
  absl::StatusOr<uint64_t> Add(uint64_t session, pid_t pid,
                               const HostedState& state,
                               const StateOwner& owner,
                               std::atomic<uint64_t>* gauge,
                               std::function<void()> uncharge = {});
  struct Entry {
    HostedState state;
    StateOwner owner;
  };
  // The state behind `handle` for a launch of `key` by a session of
  // process `pid`: NOT_FOUND (naming the handle and the target) when no
  // session of that process holds it, INVALID_ARGUMENT when it belongs to
  // another target.
  absl::StatusOr<Entry> Get(uint64_t handle, pid_t pid,
                            const TargetKey& key) const;
  // Destroys the state behind `handle` if a session of process `pid` owns
  // it; NOT_FOUND otherwise.
  absl::Status Release(uint64_t handle, pid_t pid);
  // Destroys every state session `session` owns.
  void ReleaseSession(uint64_t session);

  size_t size() const;
  uint64_t HeldBy(uint64_t session) const;

 private:
  struct Held {
    Entry entry;
    uint64_t session;
    pid_t pid;
    std::function<void()> uncharge;
  };
  struct Count {
    uint64_t n = 0;
    std::atomic<uint64_t>* gauge = nullptr;
    uint64_t uncharging = 0;  // Release's uncharges running (without mu_)
  };
  uint64_t HeldByLocked(uint64_t session) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One fewer state for `session`.
  void DropLocked(uint64_t session) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets `session`'s count once it holds nothing and has no uncharge
  // running.
  void TidyLocked(uint64_t session) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Uncharging(uint64_t session) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct SessionRef {
    const StateTable* table;
    uint64_t session;
  };
  // ReleaseSession's wait condition (mu_ held by Await).
  static bool NoUncharge(SessionRef* ref) ABSL_NO_THREAD_SAFETY_ANALYSIS;

  const uint64_t max_per_session_;
  mutable absl::Mutex mu_;
  // Starts at a random multiple of 2^32 (FirstHandle): a handle of an
  // executor that died never names a state of the next one.
  uint64_t next_handle_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Held> states_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Count> per_session_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_STATE_TABLE_H_
