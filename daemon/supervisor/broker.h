// kregd's side of one client session (DESIGN §8): binds the session to an
// executor, hands the client's socket over, then answers what only kregd
// may do for that session (register, list, resolve a target to its store
// copy). Launches never pass through here.
#ifndef KREGD_DAEMON_SUPERVISOR_BROKER_H_
#define KREGD_DAEMON_SUPERVISOR_BROKER_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "common/wire.h"
#include "daemon/base/served_session.h"
#include "daemon/base/types.h"
#include "daemon/supervisor/crash_ledger.h"
#include "daemon/supervisor/executor_pool.h"
#include "daemon/supervisor/session_bindings.h"
#include "kreg/v1/executor.pb.h"

namespace kreg {

class LocalModuleCache;
class ModuleStore;
class Registrar;
class Registry;

// What the broker of every session borrows; all must outlive the sessions.
struct BrokerContext {
  Registrar* registrar = nullptr;
  Registry* registry = nullptr;
  ModuleStore* store = nullptr;
  ExecutorPool* pool = nullptr;
  CrashLedger* ledger = nullptr;
  SessionBindings* bindings = nullptr;  // optional
  // kregd's max_module_bytes: bounds the registration uploads relayed here.
  uint64_t max_module_bytes = 512ull << 20;
  // Module bytes kregd holds at once from relayed uploads, all sessions
  // together (null: unbounded). Owned by the server.
  wire::ByteBudget* upload_budget = nullptr;
  // Local execution (DESIGN §11): the memfds handed out (null:
  // local_execution = "deny") and the count of local holds (optional).
  LocalModuleCache* local_modules = nullptr;
  std::atomic<uint64_t>* local_binds = nullptr;
};

// kregd's intake of a registration relayed by an executor with `fds`
// attached to its frame: an upload (module.upload_size) must come as
// exactly one memfd sealed with kModuleSeals of exactly that size, is
// prechecked (Registrar::PrecheckUpload, for `peer`) before a byte is read
// and its bytes are returned; any other registration carries no descriptor
// and gets "" (INVALID_ARGUMENT otherwise). The module's bytes are charged
// to `hold` (its budget: what kregd reads of uploads at once, for all
// clients) before they are read: RESOURCE_EXHAUSTED, naming the limit,
// when the budget cannot cover them; the caller keeps `hold` until it is
// done with the bytes. Shared with the fuzzer.
absl::StatusOr<std::string> TakeRelayedModule(
    Registrar* registrar, const v1::RegisterTargetHeader& header,
    std::vector<UniqueFd> fds, const PeerCred& peer, uint64_t max_module_bytes,
    wire::BudgetHold* hold);

// One accepted client connection. Run() on one thread, Shutdown() from any.
class SessionBroker final : public ServedSession {
 public:
  SessionBroker(uint64_t id, UniqueFd client, const PeerCred& peer,
                const BrokerContext& ctx);
  // A session a re-adopted executor serves already (DESIGN §12): Run()
  // serves `binding`'s broker socket and binds nothing.
  SessionBroker(uint64_t id, UniqueFd client, const PeerCred& peer,
                const BrokerContext& ctx, ExecutorPool::Binding binding);
  ~SessionBroker() override;

  void Run() override;
  void Shutdown() override;
  uint64_t id() const override { return id_; }
  const PeerCred& peer() const override { return peer_; }

 private:
  v1::BrokerReply Handle(const v1::BrokerRequest& request,
                         std::vector<UniqueFd> fds, UniqueFd* fd_out);
  // The executor sent a frame kregd does not read (over
  // kMaxBrokerRequestBytes, or too many descriptors): logs and counts it and
  // ends the session with RESOURCE_EXHAUSTED to the client.
  void RefuseExecutorMessage(int result);
  absl::StatusOr<v1::ResolveReply> Resolve(const v1::ResolveRequest& r,
                                           UniqueFd* fd_out);
  // Resolve for the client's own process (ResolveRequest.local), once the
  // registry's rules passed: the sealed memfd and a local hold (logged and
  // counted once per target and session).
  absl::StatusOr<v1::ResolveReply> ResolveLocal(const TargetKey& key,
                                                const EntryPtr& e,
                                                UniqueFd* fd_out);
  // Forgets what the session bound (it ended, or kregd leaves it to its
  // executor).
  void ForgetBindings();
  // Sends a connection-level error (response id 0) to the client.
  void RefuseClient(const absl::Status& status);

  const uint64_t id_;
  UniqueFd client_;  // kregd's copy: only written to when the executor died
  const PeerCred peer_;
  const BrokerContext ctx_;
  ExecutorPool::Binding binding_;
  int broker_fd_ = -1;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_SUPERVISOR_BROKER_H_
