// kregd's parts (docs/design.md §5): the core every part
// shares, and one part per feature (cluster, compile, sessions, metrics,
// gRPC) that starts and stops what it serves. Daemon (server.h) is the
// shell that starts them in order and stops them in reverse.
#ifndef KREGD_DAEMON_KREGD_PARTS_H_
#define KREGD_DAEMON_KREGD_PARTS_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"
#include "daemon/api/grpc_connections.h"
#include "daemon/base/uid_account.h"
#include "daemon/config/config.h"
#include "daemon/registry/journal.h"
#include "daemon/registry/module_loader.h"
#include "daemon/registry/registrar.h"
#include "daemon/registry/registration_service.h"
#include "daemon/store/module_store.h"
#include "daemon/supervisor/broker.h"
#include "daemon/supervisor/crash_ledger.h"
#include "daemon/supervisor/generation_stats.h"
#include "daemon/supervisor/isolated_repointer.h"
#include "daemon/supervisor/local_module_cache.h"
#include "daemon/supervisor/local_repointer.h"
#include "daemon/supervisor/readopt_listener.h"
#include "daemon/supervisor/repoint_fanout.h"
#include "daemon/supervisor/session_bindings.h"
#include "proto/kreg/v1/registry.pb.h"

namespace kreg {

class ClusterMirror;
class ClusterRegistry;
class ClusterService;
class CompileCache;
class CompilePeers;
class CompileService;
class ExecutorPool;
class MetricsServer;
class ModuleExchangeService;
class RegistryService;
class SessionServer;
class SupervisionService;

// What every part shares: the configuration, the registry and what it
// stands on, the crash ledger, the session bindings and the per-uid
// account. Built before the parts and destroyed after them.
struct DaemonCore {
  explicit DaemonCore(Config config);

  // Resolves socket_group, locks the state directory, opens the store and
  // replays the journal. Errors are for the operator.
  absl::Status Open();
  // Open's steps.
  absl::Status LockStateDir();
  absl::Status Replay();

  const Config config;
  const std::chrono::steady_clock::time_point started;
  ModuleStore store;
  ModuleLoader loader;
  Journal journal;
  RegistrationService registry;
  Registrar registrar;
  CrashLedger ledger;
  SessionBindings bindings;              // the registry's BindingOracle
  std::atomic<uint64_t> local_binds{0};  // local holds (DESIGN §11)
  // What each uid holds at once (DESIGN §14 rule 2): every front door
  // charges it before it spends.
  UidAccount account;
  gid_t gid = static_cast<gid_t>(-1);  // socket_group, resolved by Open
  // The sockets served, set by the shell before any part starts: the
  // gRPC socket's descriptor and path, and the session socket inherited
  // from systemd (-1: the session server binds its own).
  int listen_fd = -1;
  std::string serving_socket_path;
  int session_listen_fd = -1;
  UniqueFd lock_fd;  // flock on <state>/lock
};

// One feature of kregd. Stop runs even when Start did not (or failed), and
// leaves what never started alone.
class DaemonPart {
 public:
  virtual ~DaemonPart() = default;
  virtual absl::Status Start() = 0;
  // Before any part stops: take no new work, so that what runs ends soon.
  virtual void Quiesce() {}
  virtual void Stop() = 0;
  // The part's share of GetStatus.
  virtual void FillStatus(v1::GetStatusResponse*) {}
};

// Cluster mode (DESIGN §10, when etcd_endpoints are set): the etcd-backed
// authority, the registry's mirror on it and the peer server for module
// bytes. Standalone, only the kreg.v1.Cluster service that says so.
class ClusterPart final : public DaemonPart {
 public:
  explicit ClusterPart(DaemonCore* core);
  ~ClusterPart() override;
  absl::Status Start() override;
  void Stop() override;
  ClusterRegistry* cluster() const { return cluster_.get(); }
  ClusterService* service() const { return service_.get(); }

 private:
  DaemonCore* const core_;
  const Config& config_;  // core_->config
  // The registry's cluster collaborator, on cluster_ (which stops first).
  std::unique_ptr<ClusterMirror> mirror_;
  std::unique_ptr<ClusterRegistry> cluster_;  // null: standalone
  std::unique_ptr<ClusterService> service_;
  std::unique_ptr<ModuleExchangeService> exchange_;
  std::unique_ptr<grpc::Server> peer_server_;
};

// The compile service (DESIGN §13), its cache in <state>/compile and, in
// cluster mode, the other hosts' compiles.
class CompilePart final : public DaemonPart {
 public:
  CompilePart(DaemonCore* core, const ClusterPart* cluster);
  ~CompilePart() override;
  absl::Status Start() override;
  // Ends running compiles, so that none holds the gRPC server's shutdown
  // for up to compile_timeout_s (operator guide, "The compile service").
  void Quiesce() override;
  void Stop() override {}
  void FillStatus(v1::GetStatusResponse* r) override;
  CompileService* service() const { return service_.get(); }

 private:
  DaemonCore* const core_;
  const Config& config_;  // core_->config
  const ClusterPart* const cluster_;
  std::unique_ptr<CompileCache> cache_;
  std::unique_ptr<CompileService> service_;
  std::unique_ptr<CompilePeers> peers_;  // cluster mode
};

// The sessions (DESIGN §8, §11, §12): the executor pool, the session
// socket's server and its brokers, the re-pointers of a replacement, the
// local-module cache and the supervision socket that re-adopts executors
// an earlier kregd left running.
class SessionsPart final : public DaemonPart {
 public:
  explicit SessionsPart(DaemonCore* core);
  ~SessionsPart() override;
  absl::Status Start() override;
  // Takes no executor an earlier kregd left running.
  void Quiesce() override;
  void Stop() override;
  void FillStatus(v1::GetStatusResponse* r) override;

  // ListSessions' answer.
  void ListSessions(v1::ListSessionsResponse* resp);
  // Null before Start.
  ExecutorPool* pool() const { return pool_.get(); }
  size_t open_sessions() const;
  // Stop left executors serving their sessions (orphan_timeout): see
  // Daemon::left_executors.
  bool left_executors() const { return left_executors_; }

 private:
  // What every session's broker borrows.
  void FillBrokerContext();
  void StartReadopt(const std::string& supervision_path,
                    const AdoptionPolicy& policy);
  // Takes over an executor an earlier kregd left running (DESIGN §12) and
  // serves the sessions it brought.
  absl::Status Readopt(ReadoptOffer offer,
                       const std::function<bool()>& confirm);

  DaemonCore* const core_;
  const Config& config_;  // core_->config
  // Null: local_execution = "deny".
  std::unique_ptr<LocalModuleCache> local_modules_;
  // replace = "owner" with local execution: re-points local binds.
  std::unique_ptr<LocalRepointer> local_repointer_;
  std::unique_ptr<ExecutorPool> pool_;  // outlives the sessions using it
  // What the registry re-points a replaced target's holders with.
  std::unique_ptr<IsolatedRepointer> isolated_repointer_;
  RepointFanout repointers_;
  std::unique_ptr<SessionServer> sessions_;
  BrokerContext broker_ctx_;
  // The supervision socket (session socket path + ".exec").
  std::unique_ptr<ReadoptListener> readopt_;
  bool left_executors_ = false;
};

// The gRPC server on the gRPC socket: kreg.v1.Registry, the supervision
// and cluster services, health and reflection; its connections are
// accepted (and charged to their peers' uids) on a thread of its own.
class GrpcPart final : public DaemonPart {
 public:
  // `status_of` answers GetStatus.
  GrpcPart(DaemonCore* core, const ClusterPart* cluster,
           const CompilePart* compile, SessionsPart* sessions,
           std::function<void(v1::GetStatusResponse*)> status_of);
  ~GrpcPart() override;
  absl::Status Start() override;
  // Accepts no new connection.
  void Quiesce() override;
  void Stop() override;

 private:
  DaemonCore* const core_;
  const Config& config_;  // core_->config
  const ClusterPart* const cluster_;
  const CompilePart* const compile_;
  SessionsPart* const sessions_;
  const std::function<void(v1::GetStatusResponse*)> status_of_;
  std::unique_ptr<RegistryService> service_;
  std::unique_ptr<SupervisionService> supervision_;
  std::unique_ptr<grpc::Server> server_;
  // The gRPC socket's connections and their peers' credentials.
  GrpcConnections connections_;
  UniqueFd stop_fd_;  // eventfd that wakes the accept loop
  std::thread accept_thread_;
};

// The Prometheus endpoint (operator guide, "Watching it"), when
// metrics_listen is set.
class MetricsPart final : public DaemonPart {
 public:
  MetricsPart(DaemonCore* core, const CompilePart* compile,
              const SessionsPart* sessions);
  ~MetricsPart() override;
  absl::Status Start() override;
  void Stop() override;

 private:
  std::string Render();

  DaemonCore* const core_;
  const Config& config_;  // core_->config
  const CompilePart* const compile_;
  const SessionsPart* const sessions_;
  std::unique_ptr<MetricsServer> server_;  // null unless metrics_listen
  // Retired targets whose per-target series a scrape has already shown one
  // final time (operator guide, "Metrics"); pruned when the pool forgets
  // them.
  absl::Mutex mu_;
  std::set<GenerationId> retired_shown_ ABSL_GUARDED_BY(mu_);
};

// Launch statistics from the pool's rows (none while `pool` is null;
// metrics_part.cc): each registered target's, and Target.stats of `entry`
// with, once it was replaced, generation_stats.
std::vector<v1::TargetStats> CurrentTargetStats(
    ExecutorPool* pool, const std::vector<EntryPtr>& entries);
void StatsOf(ExecutorPool* pool, const TargetEntry& entry, v1::Target* t);

// The directory of kregd's binary.
std::string SelfDir();

// A helper kregd starts (kregd-exec, kregd-probe, kregd-compile):
// `configured` when set, else `name` next to kregd (installed), else in
// //daemon/`package` of the Bazel tree kregd runs from
// (bazel-bin/daemon/kregd/kregd); next to kregd when neither exists, so
// errors name the installed path.
std::string HelperBinary(const std::string& configured, const std::string& name,
                         const std::string& package);

// Whether modules handed out for local execution are corrupted on purpose
// (so that a test sees the shim refuse them): false, except in the test
// binary kregd_tamper_local, which overrides this weak definition.
bool TamperLocalModulesForTest();

}  // namespace kreg

#endif  // KREGD_DAEMON_KREGD_PARTS_H_
