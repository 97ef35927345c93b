// kregd's side of one connection to the session socket (DESIGN §3, §8). A
// connection whose first request is Hello is a session: it is bound to an
// executor, which gets the client's socket, and kregd answers what only it
// may do for that session (resolve a target to its store copy); launches
// never pass through here. Any other connection is a control connection,
// served by kregd itself: registrations and listings only.
#ifndef KREGD_DAEMON_SUPERVISOR_BROKER_H_
#define KREGD_DAEMON_SUPERVISOR_BROKER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"
#include "common/wire.h"
#include "daemon/base/served_session.h"
#include "daemon/base/types.h"
#include "daemon/base/uid_account.h"
#include "daemon/supervisor/crash_ledger.h"
#include "daemon/supervisor/executor_pool.h"
#include "daemon/supervisor/session_bindings.h"
#include "kreg/v1/executor.pb.h"

namespace kreg {

class LocalModuleCache;
class LocalRepointer;
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
  // kregd's max_module_bytes: bounds the uploads of control connections.
  uint64_t max_module_bytes = 512ull << 20;
  // The per-uid account (DESIGN §14 rule 2; null: unbounded, for tests):
  // control connections, upload bytes in flight and CPU-heavy work
  // (hashing and probing a registration). Owned by the server.
  UidAccount* account = nullptr;
  // How long a registration waits for its uid's other CPU-heavy work
  // (max_heavy_work_per_uid) before it is refused.
  int64_t heavy_work_wait_ms = 20000;
  // A control connection that holds no registration and sends nothing for
  // this long is closed (control_idle_timeout_s).
  int64_t control_idle_timeout_ms = 60000;
  // Connection `id` is a control connection: it stops counting as a
  // session (SessionServer::NotASession). Unset: nothing to do.
  std::function<void(uint64_t id)> not_a_session;
  // Connection `id` said Hello: it is charged as a session of its uid
  // (SessionServer::IsASession), or refused with the returned error.
  // Unset: nothing to do.
  std::function<absl::Status(uint64_t id)> is_a_session;
  // Local execution (DESIGN §11): the memfds handed out (null:
  // local_execution = "deny") and the count of local holds (optional).
  LocalModuleCache* local_modules = nullptr;
  std::atomic<uint64_t>* local_binds = nullptr;
  // Re-pointing local binds (replace = "owner" with local execution,
  // docs/replace.md section 4): the watch connections; null otherwise
  // (local binds are not replaceable, and a watch request is refused).
  LocalRepointer* local_repointer = nullptr;
  // A connection's first message must arrive whole within this time
  // (hello_timeout_s), and so must each later request of a control
  // connection once its first byte came.
  int64_t hello_timeout_ms = 10000;
  // Answers one request of a control connection (kregd:
  // daemon/api/control_requests.h, HandleControl). Required.
  std::function<v1::SessionResponse(const BrokerContext& ctx, uint64_t id,
                                    const PeerCred& peer,
                                    const v1::SessionRequest& request,
                                    std::vector<UniqueFd> fds, bool* close)>
      control;
};

// The field name of a session request's body, for errors.
std::string SessionRequestName(v1::SessionRequest::BodyCase body);

// The largest request kregd reads on a control connection, and the largest
// first message of any connection (a Hello is much smaller): registrations
// carry names, a path and sizes; module bytes travel as a sealed memfd.
constexpr uint32_t kMaxControlRequestBytes = 64u << 10;

// What a session binding of `key` runs: the current entry, or with
// `generation` > 0 (a pin, docs/replace.md §7) an entry describing that
// generation (its module, size, function, content and handler info) and
// otherwise the current one's. NOT_FOUND when `key` is not registered, or
// has no such generation (the message lists those it has).
absl::StatusOr<EntryPtr> ResolveGeneration(const Registry& registry,
                                           const TargetKey& key,
                                           uint32_t generation);

// A frame kregd read on a watch connection (its size is bounded by
// kMaxRepointAckBytes before it is read): the RepointAck it must be.
// INVALID_ARGUMENT when it carries descriptors or does not parse,
// FAILED_PRECONDITION naming any other request; the connection is then
// closed.
absl::StatusOr<v1::RepointAck> ReadRepointAck(const std::string& payload,
                                              size_t num_fds);

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

  // Serves the connection on the caller's thread: as a session (first
  // request Hello) or as a control connection.
  void Run() override;
  // One step of it (the session server's way: between steps the
  // connection waits without a thread, daemon/base/connection_parker.h).
  NextStep Step(ConnectionParker::Wake why) override;
  void Shutdown() override;
  uint64_t id() const override { return id_; }
  const PeerCred& peer() const override { return peer_; }
  // A re-adopted session's call-site states (DESIGN §12): charged to its
  // uid again, without the limit check (they exist already), and given
  // back as they are released or when the broker ends. Before Run/Step.
  void KeepStates(uint64_t n);

 private:
  // What the connection turned out to be, and so what its next step reads.
  enum class Phase { kFirst, kControl, kWatch, kSession };
  // NextRequest's answer when the connection was idle past its deadline.
  static constexpr int kIdle = -100;

  absl::Duration HelloTimeout() const;
  // Waits (without a thread) for the whole first message, for at most
  // hello_timeout of connecting, then serves it as a session or a control
  // connection.
  NextStep StepFirst(ConnectionParker::Wake why);
  // The first message looked at (`rc`, `first`, `has_fds`: TryPeekFrame's
  // answer, or kTimedOut): true when it is a Hello (the executor reads
  // it); false when the connection is served here (`*control` set) or was
  // ended (refused, silent, closed).
  bool FirstIsHello(int rc, const std::string& first, bool has_fds,
                    bool* control);
  // A StateCharge from the executor: +1 takes one of the uid's
  // max_states_per_uid (RESOURCE_EXHAUSTED naming it), -1 gives one back.
  absl::Status ChargeState(int32_t delta);
  // Charges the control connection it turned out to be to its uid (it no
  // longer counts as a session); false (refused, the client told) over the
  // uid's limit.
  bool AdmitControl();
  // Binds the session to an executor (which gets the client's socket);
  // false when refused (the client told).
  bool BindExecutor();
  // Serves a control connection until the client closes it, or until it
  // has held no registration and sent nothing for control_idle_timeout_s.
  void StartControl();
  NextStep StepControl(ConnectionParker::Wake why);
  NextStep EndControl();
  // Serves the watch connection it became (a watch request was
  // accepted): reads RepointAcks until the client closes it.
  void StartWatch();
  NextStep StepWatch(ConnectionParker::Wake why);
  // Looks at the client's next request: kOk (whole, or it carries
  // descriptors), kWouldBlock with `*wait` (not all there: wait for it
  // within hello_timeout of its first byte, or until `idle_deadline` when
  // none has begun), kIdle, kTimedOut or TryPeekFrame's error.
  int NextRequest(uint32_t max_bytes, absl::Time idle_deadline, NextStep* wait);
  // Serves the executor's broker socket of a session.
  NextStep StepSession(ConnectionParker::Wake why);
  // The executor's broker socket ended (`closed`: the executor said so;
  // `refused`: kregd ended it): releases the binding and tells the client
  // of a crash.
  void EndSession(bool closed, bool refused);
  v1::BrokerReply Handle(const v1::BrokerRequest& request, UniqueFd* fd_out);
  // The executor sent a frame kregd does not read (over
  // kMaxBrokerRequestBytes, or too many descriptors): logs and counts it and
  // ends the session with RESOURCE_EXHAUSTED to the client.
  void RefuseExecutorMessage(int result);
  absl::StatusOr<v1::ResolveReply> Resolve(const v1::ResolveRequest& r,
                                           UniqueFd* fd_out);
  // Resolve for the client's own process (ResolveRequest.local), once the
  // registry's rules passed: the sealed memfd and a local hold (logged and
  // counted once per target and session); `pinned`: a generation asked
  // for (docs/replace.md section 7); `registered`: the generation the
  // process registered (held for its content, SessionBindings::Bound).
  absl::StatusOr<v1::ResolveReply> ResolveLocal(const TargetKey& key,
                                                const EntryPtr& e, bool pinned,
                                                uint32_t registered,
                                                UniqueFd* fd_out);
  // Forgets what the session bound (it ended, or kregd leaves it to its
  // executor).
  void ForgetBindings();
  // Sends a connection-level error (response id 0) to the client.
  void RefuseClient(const absl::Status& status);

  const uint64_t id_;
  Phase phase_ = Phase::kFirst;
  absl::Time first_deadline_ = absl::InfiniteFuture();
  // A begun request must be whole by then.
  absl::Time request_deadline_ = absl::InfiniteFuture();
  absl::Time last_request_ = absl::InfiniteFuture();  // control connections
  bool holds_registrations_ = false;
  wire::RecvBuffer control_buffer_;
  wire::RecvBuffer session_buffer_;
  UniqueFd client_;  // kregd's copy: only written to when the executor died
  const PeerCred peer_;
  const BrokerContext ctx_;
  // The session's call-site states charged to its uid (broker thread only);
  // given back when the broker ends.
  std::vector<UidAccount::Charge> states_;
  // A control connection's charge (max_control_connections_per_uid).
  UidAccount::Charge control_charge_;
  ExecutorPool::Binding binding_;
  int broker_fd_ = -1;
  // The client's socket went to an executor, which serves on when kregd
  // leaves it running (Shutdown then leaves the socket alone).
  std::atomic<bool> handed_over_{false};
};

}  // namespace kreg

#endif  // KREGD_DAEMON_SUPERVISOR_BROKER_H_
