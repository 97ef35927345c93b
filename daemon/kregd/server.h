// The kregd process: owns the store, journal, registry, crash ledger, the
// executor pool, the gRPC server, the session server (whose sessions are
// brokers handing connections to executors) and the listening sockets.
// It hosts no handler: executors (kregd-exec) run them (DESIGN §8).
#ifndef KREGD_DAEMON_KREGD_SERVER_H_
#define KREGD_DAEMON_KREGD_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"
#include "common/wire.h"
#include "daemon/api/grpc_connections.h"
#include "daemon/api/grpc_service.h"
#include "daemon/base/uid_account.h"
#include "daemon/base/unix_listener.h"
#include "daemon/config/config.h"
#include "daemon/registry/journal.h"
#include "daemon/registry/module_loader.h"
#include "daemon/registry/registrar.h"
#include "daemon/registry/registration_service.h"
#include "daemon/store/module_store.h"
#include "daemon/supervisor/broker.h"
#include "daemon/supervisor/crash_ledger.h"
#include "daemon/supervisor/isolated_repointer.h"
#include "daemon/supervisor/local_module_cache.h"
#include "daemon/supervisor/local_repointer.h"
#include "daemon/supervisor/readopt_listener.h"
#include "daemon/supervisor/repoint_fanout.h"
#include "daemon/supervisor/session_bindings.h"

namespace kreg {

class ClusterMirror;
class ClusterRegistry;
class CompileCache;
class CompilePeers;
class CompileService;
class ClusterService;
class ExecutorPool;
class ModuleExchangeService;
class MetricsServer;
class SessionServer;
class SupervisionService;

// Whether modules handed out for local execution are corrupted on purpose
// (so that a test sees the shim refuse them): false, except in the test
// binary kregd_tamper_local, which overrides this weak definition.
bool TamperLocalModulesForTest();

class Daemon {
 public:
  explicit Daemon(Config config);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Replays the journal, listens (or adopts systemd's sockets), starts
  // serving and tells systemd READY=1. Errors are for the operator.
  absl::Status Start();
  // Stops accepting, finishes in-flight calls (bounded), closes sessions.
  void Shutdown();
  // Shutdown() left executors serving their sessions (orphan_timeout): the
  // threads that wait for them use this object until the process exits, so
  // the caller must end the process without destroying it (_exit).
  bool left_executors() const { return left_executors_; }

 private:
  absl::Status LockStateDir();
  absl::Status Replay();
  absl::Status Listen();
  void WatchdogLoop(uint64_t interval_us);
  void FillStatus(v1::GetStatusResponse* resp);
  // GetConfig's answer: the effective configuration and where each key
  // came from.
  void FillConfig(v1::GetConfigResponse* r) const;
  absl::Status StartSessions();
  // StartSessions' parts: what every session's broker borrows, and the
  // supervision socket's listener (a warning, not an error, when it fails).
  void FillBrokerContext();
  void StartReadopt(const std::string& supervision_path,
                    const AdoptionPolicy& policy);
  void StopSessions();
  // Takes over an executor an earlier kregd left running (DESIGN §12) and
  // serves the sessions it brought.
  absl::Status Readopt(ReadoptOffer offer,
                       const std::function<bool()>& confirm);
  void FillSessionStatus(v1::GetStatusResponse* resp);
  // server_cluster.cc: cluster mode (when etcd_endpoints are set).
  absl::Status StartCluster();
  void StopCluster();
  // daemon_metrics.cc: launch statistics, sessions and the Prometheus
  // exposition, from the registry, the pool and the executors' pages.
  absl::Status StartMetrics();
  std::vector<v1::TargetStats> CurrentTargetStats();
  // Target.stats of `entry` and, once it was replaced, generation_stats.
  void StatsOf(const TargetEntry& entry, v1::Target* t);
  void ListSessions(v1::ListSessionsResponse* resp);
  std::string RenderMetrics();
  // The compile service from the config (server_compile.cc).
  absl::Status StartCompile();
  void FillCompileStatus(v1::GetStatusResponse* resp);
  // The GPU sharing mode at start: a warning without MPS (DESIGN §8).
  void LogGpuSharing();

  const Config config_;
  const std::chrono::steady_clock::time_point started_;
  UniqueFd lock_fd_;
  ModuleStore store_;
  ModuleLoader loader_;
  Journal journal_;
  RegistrationService registry_;
  Registrar registrar_;
  CrashLedger ledger_;
  SessionBindings bindings_;              // the registry's BindingOracle
  std::atomic<uint64_t> local_binds_{0};  // local holds (DESIGN §11)
  // What each uid holds at once (DESIGN §14 rule 2): every front door
  // charges it before it spends.
  UidAccount account_;
  // Null: local_execution = "deny".
  std::unique_ptr<LocalModuleCache> local_modules_;
  // replace = "owner" with local execution: re-points local binds.
  std::unique_ptr<LocalRepointer> local_repointer_;
  std::unique_ptr<ExecutorPool> pool_;  // outlives the sessions using it
  // What the registry re-points a replaced target's holders with.
  std::unique_ptr<IsolatedRepointer> isolated_repointer_;
  RepointFanout repointers_;
  std::unique_ptr<SessionServer> sessions_;
  BrokerContext broker_ctx_;  // what every session's broker borrows
  // The supervision socket (session socket path + ".exec").
  std::unique_ptr<ReadoptListener> readopt_;
  // The compile service (DESIGN §13): cache in <state>/compile.
  std::unique_ptr<CompileCache> compile_cache_;
  std::unique_ptr<CompileService> compile_;
  std::unique_ptr<CompilePeers> compile_peers_;  // cluster mode
  std::unique_ptr<RegistryService> service_;
  std::unique_ptr<SupervisionService> supervision_;
  std::unique_ptr<grpc::Server> server_;
  // Cluster mode: the etcd-backed authority, the local kreg.v1.Cluster
  // service (answers FAILED_PRECONDITION when standalone) and the TCP
  // server peers fetch modules from.
  // The registry's cluster collaborator, on cluster_ (which stops first).
  std::unique_ptr<ClusterMirror> cluster_mirror_;
  std::unique_ptr<ClusterRegistry> cluster_;
  std::unique_ptr<ClusterService> cluster_service_;
  std::unique_ptr<ModuleExchangeService> exchange_;
  std::unique_ptr<grpc::Server> peer_server_;
  std::unique_ptr<MetricsServer> metrics_;  // null unless metrics_listen
  // Retired targets whose per-target series a scrape has already shown one
  // final time (operator guide, "Metrics"); pruned when the pool forgets
  // them.
  absl::Mutex metrics_mu_;
  std::set<GenerationId> metrics_retired_shown_ ABSL_GUARDED_BY(metrics_mu_);
  UniqueFd listen_fd_;
  int session_listen_fd_ = -1;  // inherited from systemd, or -1
  UniqueFd stop_fd_;            // eventfd that wakes the accept loop
  std::unique_ptr<UnixListener> listener_;  // unless inherited from systemd
  bool left_executors_ = false;
  gid_t gid_ = static_cast<gid_t>(-1);  // socket_group, resolved at Start
  std::string serving_socket_path_;
  std::thread accept_thread_;
  std::thread watchdog_thread_;
  std::atomic<bool> stopping_{false};
  // The gRPC socket's connections and their peers' credentials (accepted
  // on accept_thread_).
  GrpcConnections connections_;
};

// The directory of kregd's binary.
std::string SelfDir();

// A helper kregd starts (kregd-exec, kregd-probe, kregd-compile):
// `configured` when set, else `name` next to kregd (installed), else in
// //daemon/`package` of the Bazel tree kregd runs from
// (bazel-bin/daemon/kregd/kregd); next to kregd when neither exists, so
// errors name the installed path.
std::string HelperBinary(const std::string& configured, const std::string& name,
                         const std::string& package);

}  // namespace kreg

#endif  // KREGD_DAEMON_KREGD_SERVER_H_
