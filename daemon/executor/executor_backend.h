// The SessionBackend of a session running inside an executor (DESIGN §8):
// registration, listing and target resolution go to kregd over the
// session's broker socket; handlers run here, through the executor's
// FfiHost, on modules from its ModuleCache.
#ifndef KREGD_DAEMON_EXECUTOR_EXECUTOR_BACKEND_H_
#define KREGD_DAEMON_EXECUTOR_EXECUTOR_BACKEND_H_

#include <atomic>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"
#include "daemon/base/status_page.h"
#include "daemon/executor/module_cache.h"
#include "daemon/executor/repoint_table.h"
#include "daemon/executor/session.h"
#include "kreg/v1/executor.pb.h"

namespace kreg {

class CudaDevices;
class FfiHost;

// What every session of one executor shares; all must outlive the
// sessions. `recycle` is set when the executor must be replaced (a sticky
// CUDA error): sessions then end after their current reply.
struct ExecutorShared {
  ModuleCache* modules = nullptr;
  FfiHost* host = nullptr;
  CudaDevices* cuda = nullptr;  // null: no CUDA
  StatusPage* page = nullptr;
  std::atomic<bool>* recycle = nullptr;
  // Set when the next kregd drains the executor (DESIGN §12): sessions end
  // after their current reply.
  std::atomic<bool>* drain = nullptr;
  // The targets kregd re-pointed in this executor (docs/replace.md).
  RepointTable* repoints = nullptr;
  // The call-site states of every session (handler bundles).
  StateTable* states = nullptr;
};

// Leaves `text` (cut to fit) as the status page's note, the executor's last
// words that kregd reads when it ends.
void WriteNote(StatusPage* page, const std::string& text);

// The session slot whose handler the calling thread is running (between
// BeginLaunch and EndLaunch), -1 when none. Async-signal-safe: the
// executor's crash handler records it in the status page.
int32_t RunningSlotOfThisThread();

// One session's backend. Used by that session's thread, except
// ReplaceBroker and Resolved (the executor's main thread, when a new kregd
// adopts it).
class ExecutorBackend final : public SessionBackend {
 public:
  // A target this session resolved through kregd and the token kregd gave
  // it (0: bound for the client's own process, DESIGN §11).
  using Resolution = std::pair<TargetKey, uint32_t>;

  ExecutorBackend(UniqueFd broker, uint32_t slot, const ExecutorShared& shared);
  ~ExecutorBackend() override;  // tells kregd the session ended

  // Relays to kregd (BrokerRequest.resolve with local set): kregd applies
  // the rules and its policy and attaches the sealed memfd, passed on as is.
  absl::StatusOr<v1::BindLocalReply> BindLocal(const v1::BindLocal& request,
                                               UniqueFd* module) override;
  absl::StatusOr<ResolvedHandler> Lookup(const TargetKey& key,
                                         uint32_t generation) override;
  absl::StatusOr<ResolvedBundle> LookupBundle(const TargetKey& key,
                                              uint32_t generation) override;
  StateTable* States() override { return shared_.states; }
  // Relays to kregd (BrokerRequest.state_charge).
  absl::Status ChargeState(int delta) override;
  std::atomic<uint64_t>* StateGauge() override { return &slot_->states; }
  absl::Status Execute(void* handler, const LaunchFrame& frame) override;
  absl::Status ExecuteWith(void* handler, const LaunchFrame& frame,
                           const CallOptions& options) override;
  uint32_t ffi_api_major() const override;
  uint32_t ffi_api_minor() const override;
  void BeginLaunch(uint64_t request_id, const TargetKey& key,
                   uint32_t token) override;
  // Counts the call and its latency in the target's stats row.
  void EndLaunch(bool ok) override;
  void ArenaSized(uint64_t bytes) override;
  bool ShouldStop() override;
  bool LostDaemon() const override { return lost_kregd_.load(); }
  const RepointTable* Repoints() const override { return shared_.repoints; }

  // Re-adoption (DESIGN §12): from now on relay to kregd over `broker`.
  // False (and `broker` untouched) once the session is ending: it found
  // its broker closed, or it told kregd it ended.
  bool ReplaceBroker(UniqueFd* broker);
  // What the session resolved, and the tokens of the generations kregd
  // re-pointed those targets to since.
  std::vector<Resolution> Resolved() const;

 private:
  // One request/reply with kregd. UNAVAILABLE when kregd is gone;
  // INVALID_ARGUMENT (nothing sent) when the request exceeds
  // kMaxBrokerRequestBytes.
  absl::StatusOr<v1::BrokerReply> Call(const v1::BrokerRequest& request,
                                       UniqueFd* fd_out);
  // Asks kregd for `key`'s current (or pinned) generation and loads its
  // bundle; records the resolution.
  absl::StatusOr<ResolvedBundle> Resolve(const TargetKey& key,
                                         uint32_t generation, bool* content);

  // Held across a whole relay: only re-adoption contends for it.
  mutable absl::Mutex broker_mu_;
  UniqueFd broker_ ABSL_GUARDED_BY(broker_mu_);
  bool closed_ ABSL_GUARDED_BY(broker_mu_) = false;  // SessionClosed sent
  ExecSlot* const slot_;
  const int32_t slot_index_;
  // A relay found the broker socket closed.
  std::atomic<bool> lost_kregd_{false};
  const ExecutorShared shared_;
  mutable absl::Mutex resolved_mu_;
  std::vector<Resolution> resolved_ ABSL_GUARDED_BY(resolved_mu_);
  // The launch in progress (BeginLaunch .. EndLaunch).
  StatsRow* launch_row_ = nullptr;
  int64_t launch_started_ns_ = 0;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_EXECUTOR_BACKEND_H_
