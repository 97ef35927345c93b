// Re-points the isolated holders of a replaced target (docs/replace.md
// section 3): their executors load the new generation and switch at the
// next launch.
#ifndef KREGD_DAEMON_SUPERVISOR_ISOLATED_REPOINTER_H_
#define KREGD_DAEMON_SUPERVISOR_ISOLATED_REPOINTER_H_

#include <set>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "daemon/registry/repointer.h"
#include "daemon/store/module_store.h"
#include "daemon/supervisor/executor_pool.h"
#include "daemon/supervisor/session_bindings.h"

namespace kreg {

// Thread-safe; all three must outlive it.
class IsolatedRepointer final : public Repointer {
 public:
  IsolatedRepointer(SessionBindings* bindings, ExecutorPool* pool,
                    const ModuleStore* store)
      : bindings_(bindings), pool_(pool), store_(store) {}
  // Sends ExecRepoint (with the store copy) to every executor that serves a
  // session holding `entry.key` not locally, then waits for their acks
  // until `deadline`. A session that acked, or that no executor serves (a
  // registering control connection: it runs nothing), is recorded at
  // `entry.generation` in the bindings; the others are laggards.
  std::vector<Laggard> Repoint(const TargetEntry& entry,
                               absl::Time deadline) override;
  // Records the acks that came after Repoint's deadline (a continued
  // executor's), so the bindings show what each holder runs now. Cheap when
  // none is awaited; called before the bindings are listed.
  void Refresh();

 private:
  // Sessions that did not answer `repoint` in time.
  struct Late {
    v1::ExecRepoint repoint;
    std::set<uint64_t> sessions;
  };
  absl::Mutex mu_;
  std::vector<Late> late_ ABSL_GUARDED_BY(mu_);
  SessionBindings* const bindings_;
  ExecutorPool* const pool_;
  const ModuleStore* const store_;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_SUPERVISOR_ISOLATED_REPOINTER_H_
