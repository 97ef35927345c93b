#include "daemon/kregd/server.h"

#include <fcntl.h>
#include <grp.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_posix.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/paths.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "daemon/api/control_requests.h"
#include "daemon/api/session_server.h"
#include "daemon/base/adoption.h"
#include "daemon/base/files.h"
#include "daemon/base/hosted_api.h"
#include "daemon/cluster/cluster_registry.h"
#include "daemon/cluster/cluster_service.h"
#include "daemon/cluster/module_exchange.h"
#include "daemon/compile_service/compile_service.h"
#include "daemon/metrics/http_server.h"
#include "daemon/registry/runnable.h"
#include "daemon/supervisor/broker.h"
#include "daemon/supervisor/executor.h"
#include "daemon/supervisor/executor_pool.h"
#include "daemon/supervisor/gpu_sharing.h"
#include "daemon/supervisor/supervision_service.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

// mkdir -p with `mode` for the directories it creates.
absl::Status MakeDirs(const std::string& dir, mode_t mode) {
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      std::string part = dir.substr(0, i);
      if (::mkdir(part.c_str(), mode) != 0 && errno != EEXIST) {
        return ErrnoError(absl::StrCat("cannot create directory ", part));
      }
    }
  }
  return absl::OkStatus();
}

std::string DirName(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos || slash == 0 ? "/" : path.substr(0, slash);
}

// The directories whose writers could stand in for kregd: the state
// directory (the adoption secret, the journal, the store) and its sockets'
// (whoever may write there can bind the supervision socket while kregd
// restarts and be offered executors and their clients' sessions). Each
// must be owned by kregd's uid or root and writable by its owner alone
// (a sticky 1777 directory like /tmp is not). FAILED_PRECONDITION naming
// the first that is not; with allow_insecure_dirs only a warning.
absl::Status CheckPrivateDirs(const Config& c, const std::string& socket) {
  const std::pair<const char*, std::string> dirs[] = {
      {"socket directory", DirName(socket)}, {"state directory", c.state_dir}};
  for (const auto& [what, dir] : dirs) {
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) {
      return ErrnoError(absl::StrCat("cannot stat the ", what, " ", dir));
    }
    if ((st.st_uid == ::geteuid() || st.st_uid == 0) &&
        (st.st_mode & (S_IWGRP | S_IWOTH)) == 0) {
      continue;
    }
    const std::string why = absl::StrCat(
        "the ", what, " ", dir, " (owner uid ", st.st_uid, ", group ",
        st.st_gid, ", mode ", absl::StrFormat("%04o", st.st_mode & 07777),
        ") may be written by others than kregd (uid ", ::geteuid(),
        "), who could bind kregd's sockets there while it restarts and be "
        "handed executors and their clients' sessions, or replace its "
        "state; make it owned by kregd's user and writable by its owner "
        "only (chown, chmod 0755), or choose another directory");
    if (!c.allow_insecure_dirs) {
      return absl::FailedPreconditionError(absl::StrCat(
          why,
          " (allow_insecure_dirs = true, --allow-insecure-dirs, starts "
          "anyway)"));
    }
    spdlog::warn("{} (starting anyway: allow_insecure_dirs = true)", why);
  }
  return absl::OkStatus();
}

// The gid of `group` ((gid_t)-1 for ""), INVALID_ARGUMENT if it does not
// exist.
absl::StatusOr<gid_t> SocketGid(const std::string& group) {
  if (group.empty()) return static_cast<gid_t>(-1);
  struct group* g = ::getgrnam(group.c_str());
  if (g == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket_group \"", group, "\" does not exist"));
  }
  return g->gr_gid;
}

// The per-uid limits of the account (operator guide, "Per-uid limits").
UidLimits UidLimitsOf(const Config& c) {
  UidLimits l{};
  auto set = [&l](UidResource r, uint64_t v) { l[static_cast<size_t>(r)] = v; };
  set(UidResource::kGrpcConnections, c.max_grpc_connections_per_uid);
  set(UidResource::kGrpcCalls, c.max_grpc_calls_per_uid);
  set(UidResource::kSessions, c.max_sessions_per_uid);
  set(UidResource::kControlConnections, c.max_control_connections_per_uid);
  set(UidResource::kUploadBytes, c.max_upload_bytes_per_uid != 0
                                     ? c.max_upload_bytes_per_uid
                                     : 2 * c.max_module_bytes);
  set(UidResource::kHeavyWork, c.max_heavy_work_per_uid);
  set(UidResource::kPendingConnections, c.max_pending_connections_per_uid);
  set(UidResource::kWatchConnections, c.max_watch_connections_per_uid);
  set(UidResource::kStates, c.max_states_per_uid);
  return l;
}

}  // namespace

std::string SelfDir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  return DirName(std::string(buf, static_cast<size_t>(n)));
}

std::string HelperBinary(const std::string& configured, const std::string& name,
                         const std::string& package) {
  if (!configured.empty()) return configured;
  std::string beside = SelfDir() + "/" + name;
  std::string in_tree = SelfDir() + "/../" + package + "/" + name;
  if (::access(beside.c_str(), X_OK) != 0 &&
      ::access(in_tree.c_str(), X_OK) == 0) {
    return in_tree;
  }
  return beside;
}

// Weak: only the test binary kregd_tamper_local (testing/tamper_local.cc)
// says true. kregd itself reads no test switch.
__attribute__((weak)) bool TamperLocalModulesForTest() { return false; }

Daemon::Daemon(Config config)
    : config_(std::move(config)),
      started_(std::chrono::steady_clock::now()),
      store_(config_.state_dir + "/modules"),
      loader_(&store_,
              HelperBinary(config_.probe_binary, "kregd-probe", "executor"),
              config_.probe_timeout_s),
      journal_(config_.state_dir + "/journal"),
      registry_(&loader_, &journal_,
                RegistryLimits{
                    config_.max_registrations_per_uid,
                    config_.max_store_bytes_per_uid, static_cast<uid_t>(-1),
                    config_.replace == "owner",
                    absl::Seconds(config_.replace_timeout_s),
                    static_cast<uint32_t>(config_.max_generations_per_target)}),
      registrar_(&registry_.core(),
                 ModulePolicy{config_.allowed_roots, config_.max_module_bytes,
                              HelperBinary(config_.probe_binary, "kregd-probe",
                                           "executor")}),
      ledger_(
          CrashPolicy{config_.quarantine_crashes, config_.quarantine_window_s}),
      account_(UidLimitsOf(config_)),
      connections_(
          GrpcConnectionLimits{
              config_.max_grpc_connections,
              std::chrono::milliseconds(static_cast<int64_t>(
                  config_.grpc_first_message_timeout_s * 1000.0))},
          &account_, [this](int fd) {
            grpc::AddInsecureChannelFromFd(server_.get(), fd);
          }) {}

Daemon::~Daemon() { Shutdown(); }

absl::Status Daemon::LockStateDir() {
  // A user's own kregd that found no XDG variables lands on the system's
  // directories: say how to run one of its own.
  auto hint = [this](absl::Status st) {  // errno is still the failure's
    if ((errno != EACCES && errno != EPERM) || ::geteuid() == 0) return st;
    return absl::PermissionDeniedError(absl::StrCat(
        st.message(), "; kregd runs as uid ", ::geteuid(),
        ", which may not use the state directory ", config_.state_dir,
        ": for a kregd of your own pass --state-dir and --socket (or set "
        "XDG_STATE_HOME and XDG_RUNTIME_DIR), or use the system kregd"));
  };
  absl::Status st = MakeDirs(config_.state_dir, 0700);
  if (!st.ok()) return hint(st);
  std::string lock = config_.state_dir + "/lock";
  lock_fd_.reset(::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock_fd_.ok())
    return hint(ErrnoError(absl::StrCat("cannot open ", lock)));
  if (::flock(lock_fd_.get(), LOCK_EX | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("state directory ", config_.state_dir,
                     " is in use by another kregd; one daemon per state "
                     "directory"));
  }
  return store_.Init();
}

absl::Status Daemon::Replay() {
  KREG_ASSIGN_OR_RETURN(std::vector<TargetEntry> entries, journal_.Open());
  int restored = 0;
  for (const TargetEntry& e : entries) {
    absl::Status st = registry_.Restore(e);
    if (st.ok()) {
      ++restored;
    } else {
      spdlog::error("journal: target {} ({}) kept reserved but unusable: {}",
                    e.key.name, PlatformName(e.key.platform),
                    std::string(st.message()));
    }
  }
  spdlog::info("journal replayed: {} records, {} loaded", entries.size(),
               restored);
  // Store files no journaled target references: a crash came between a
  // retirement's journal record and the removal of its module, or between a
  // module's commit and its registration's record.
  absl::StatusOr<GcOutcome> swept =
      registry_.CollectGarbage(PeerCred{::geteuid(), ::getegid(), ::getpid()});
  if (!swept.ok()) {
    spdlog::warn("module store: unreferenced files not removed at start: {}",
                 std::string(swept.status().message()));
  }
  for (const NameReservation& r : journal_.reservations()) {
    registry_.RestoreReservation(r);
  }
  // Quarantines survive restarts until `kregctl unquarantine`.
  for (const CrashRecord& q : journal_.quarantines()) {
    ledger_.Restore(q);
    spdlog::warn(
        "journal: target {} ({}) stays quarantined for uid {} (last: {}); "
        "`kregctl unquarantine {} --platform {}` lifts it",
        q.key.name, PlatformName(q.key.platform), q.uid, q.last_reason,
        q.key.name, PlatformName(q.key.platform));
  }
  ledger_.SetSink([this](CrashRecord row, bool quarantined) {
    row.quarantined = quarantined;
    absl::Status st = journal_.AppendQuarantine(row);
    if (!st.ok()) {
      spdlog::error(
          "journal: the {} of target {} ({}) for uid {} is not recorded and "
          "will not survive a restart: {}",
          quarantined ? "quarantine" : "lifted quarantine", row.key.name,
          PlatformName(row.key.platform), row.uid, std::string(st.message()));
    }
  });
  return absl::OkStatus();
}

absl::Status Daemon::Listen() {
  int n = sd_listen_fds(/*unset_environment=*/1);
  if (n > 0) {
    for (int fd = SD_LISTEN_FDS_START; fd < SD_LISTEN_FDS_START + n; ++fd) {
      if (sd_is_socket_unix(fd, SOCK_STREAM, /*listening=*/1, nullptr, 0) <=
          0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "inherited fd ", fd,
            " is not a listening Unix stream socket; kregd.socket must list "
            "the gRPC socket first and the session socket second "
            "(ListenStream=)"));
      }
    }
    // systemd hands them over without close-on-exec: no helper kregd
    // starts may inherit them.
    for (int fd = SD_LISTEN_FDS_START; fd < SD_LISTEN_FDS_START + n; ++fd) {
      ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
    listen_fd_.reset(SD_LISTEN_FDS_START);
    if (n > 1) session_listen_fd_ = SD_LISTEN_FDS_START + 1;
    // Report the socket actually served, not the configured default.
    sockaddr_un addr{};
    socklen_t len = sizeof(addr);
    if (::getsockname(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr),
                      &len) == 0 &&
        addr.sun_path[0] != '\0') {
      serving_socket_path_ = addr.sun_path;
    }
    spdlog::info("serving on {} socket(s) inherited from systemd ({})", n,
                 serving_socket_path_);
    return absl::OkStatus();
  }
  KREG_RETURN_IF_ERROR(MakeDirs(DirName(config_.socket_path), 0755));
  KREG_ASSIGN_OR_RETURN(
      UnixListener l,
      UnixListener::Bind(config_.socket_path, 0660, gid_, "socket"));
  listener_ = std::make_unique<UnixListener>(std::move(l));
  // Ours to poll and accept on; close-on-exec like every descriptor of
  // kregd, so no helper it starts holds the socket open after kregd ends.
  listen_fd_.reset(::fcntl(listener_->fd(), F_DUPFD_CLOEXEC, 0));
  serving_socket_path_ = config_.socket_path;
  return absl::OkStatus();
}

absl::Status Daemon::Start() {
  KREG_ASSIGN_OR_RETURN(gid_, SocketGid(config_.socket_group));
  absl::Status st = LockStateDir();
  if (st.ok()) st = Replay();
  if (st.ok()) st = StartCluster();
  if (st.ok()) st = Listen();
  if (st.ok()) st = CheckPrivateDirs(config_, serving_socket_path_);
  if (st.ok()) st = StartCompile();
  if (!st.ok()) return st;

  RegistryServiceParts parts;
  parts.registrar = &registrar_;
  parts.registry = &registry_;
  parts.peer_of = [this](const std::string& peer) {
    return connections_.PeerOf(peer);
  };
  parts.status_of = [this](v1::GetStatusResponse* r) { FillStatus(r); };
  // Whether executors here can run CUDA launches (driver and a device; no
  // context is created in kregd), for Target.not_runnable.
  parts.cuda_status_of = [] { return CudaLaunchStatus(); };
  parts.stats_of = [this](const TargetEntry& e, v1::Target* t) {
    StatsOf(e, t);
  };
  parts.sessions_of = [this](v1::ListSessionsResponse* r) { ListSessions(r); };
  parts.config_of = [this](v1::GetConfigResponse* r) { FillConfig(r); };
  parts.compile = compile_.get();
  parts.account = &account_;
  parts.stream_timeout =
      absl::Milliseconds(config_.grpc_stream_timeout_s * 1000.0);
  parts.heavy_work_wait = absl::Milliseconds(config_.probe_timeout_s * 1000.0);
  service_ = std::make_unique<RegistryService>(std::move(parts));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.RegisterService(service_.get());
  supervision_ = std::make_unique<SupervisionService>(
      &ledger_,
      [this](const std::string& peer) { return connections_.PeerOf(peer); });
  builder.RegisterService(supervision_.get());
  builder.RegisterService(cluster_service_.get());
  builder.SetMaxReceiveMessageSize(8 << 20);
  // A connection with no call in flight for grpc_stream_timeout_s is
  // closed (GOAWAY; clients reconnect when they next call): one that sent
  // its first bytes and then stalled holds nothing for longer.
  builder.AddChannelArgument(
      GRPC_ARG_MAX_CONNECTION_IDLE_MS,
      static_cast<int>(config_.grpc_stream_timeout_s * 1000.0));
  // One connection opens at most this many streams at once, and all calls
  // together get at most grpc_max_threads threads: a call beyond them is
  // refused (RESOURCE_EXHAUSTED), not given a thread of its own.
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             config_.max_grpc_streams_per_connection);
  grpc::ResourceQuota quota("kregd-grpc");
  quota.SetMaxThreads(config_.grpc_max_threads);
  builder.SetResourceQuota(quota);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    return absl::InternalError("the gRPC server could not be started");
  }
  // grpc.health.v1 answers for the whole server ("") and, by name, for the
  // service clients actually use.
  server_->GetHealthCheckService()->SetServingStatus("kreg.v1.Registry", true);
  st = StartSessions();
  if (st.ok()) st = StartMetrics();
  if (!st.ok()) return st;
  LogGpuSharing();
  stop_fd_.reset(::eventfd(0, EFD_CLOEXEC));
  accept_thread_ = std::thread(
      [this] { connections_.Run(listen_fd_.get(), stop_fd_.get()); });

  uint64_t watchdog_us = 0;
  if (sd_watchdog_enabled(/*unset_environment=*/0, &watchdog_us) > 0) {
    watchdog_thread_ =
        std::thread([this, watchdog_us] { WatchdogLoop(watchdog_us / 2); });
  }
  sd_notifyf(0, "READY=1\nSTATUS=serving %zu targets on %s",
             registry_.List().size(), serving_socket_path_.c_str());
  spdlog::info("kregd {} serving {} (state {})", kKregVersion,
               serving_socket_path_, config_.state_dir);
  return absl::OkStatus();
}

void Daemon::WatchdogLoop(uint64_t interval_us) {
  while (!stopping_.load()) {
    // Liveness: the registry answers (its lock is not stuck).
    registry_.List();
    sd_notify(0, "WATCHDOG=1");
    pollfd p{stop_fd_.get(), POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(interval_us / 1000));
  }
}

void Daemon::FillStatus(v1::GetStatusResponse* r) {
  r->set_version(kKregVersion);
  r->set_uptime_s(std::chrono::duration_cast<std::chrono::seconds>(
                      std::chrono::steady_clock::now() - started_)
                      .count());
  r->set_targets(static_cast<uint32_t>(registry_.List().size()));
  // Modules executors load: the distinct store copies registered targets
  // use (kregd itself loads none).
  std::set<std::string> modules;
  for (const EntryPtr& e : registry_.List()) {
    if (!e->module_digest.empty()) modules.insert(e->module_digest);
  }
  r->set_modules_loaded(static_cast<uint32_t>(modules.size()));
  r->set_registrations_refused(registry_.refused());
  r->set_state_dir(config_.state_dir);
  r->set_socket_path(serving_socket_path_);
  r->set_ffi_api_major(kHostedApiMajor);
  r->set_ffi_api_minor(kHostedApiMinor);
  r->set_max_module_bytes(config_.max_module_bytes);
  GpuSharing sharing = DescribeGpuSharing(
      CudaLaunchStatus(),
      ProbeMpsControl(MpsPipeDir(std::getenv("CUDA_MPS_PIPE_DIRECTORY"))));
  r->set_gpu_sharing(sharing.mode);
  r->set_gpu_sharing_note(sharing.note);
  FillSessionStatus(r);
  FillCompileStatus(r);
}

void Daemon::Shutdown() {
  if (stopping_.exchange(true)) return;
  sd_notify(0, "STOPPING=1");
  if (stop_fd_.ok()) {
    uint64_t one = 1;
    (void)!::write(stop_fd_.get(), &one, sizeof(one));
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  if (watchdog_thread_.joinable()) watchdog_thread_.join();
  metrics_.reset();  // before what it reads
  StopSessions();
  if (pool_ != nullptr && pool_->leaving()) {
    // Threads still wait for the executors left serving their sessions
    // (DESIGN §12): the pool outlives them, until the process exits.
    (void)pool_.release();
    left_executors_ = true;
  }
  // A compile in flight would hold the gRPC server's shutdown for up to
  // compile_timeout_s (operator guide, "The compile service").
  if (compile_ != nullptr) compile_->Shutdown();
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(5));
  }
  StopCluster();
  listener_.reset();  // removes the path unless a newer kregd took it
  spdlog::info("kregd stopped");
}

void Daemon::LogGpuSharing() {
  MpsControl mps =
      ProbeMpsControl(MpsPipeDir(std::getenv("CUDA_MPS_PIPE_DIRECTORY")));
  GpuSharing sharing = DescribeGpuSharing(CudaLaunchStatus(), mps);
  if (std::string warning = GpuSharingWarning(sharing, mps); !warning.empty()) {
    spdlog::warn("{}", warning);
  } else {
    spdlog::info("GPU sharing: {} ({})", sharing.mode, sharing.note);
  }
}

namespace {

// The executor binary (HelperBinary); FAILED_PRECONDITION when it is not
// executable.
absl::StatusOr<std::string> ExecutorBinary(const Config& c) {
  std::string binary =
      HelperBinary(c.executor_binary, "kregd-exec", "executor");
  if (::access(binary.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the executor binary ", binary,
                     " is missing or not executable (", strerror(errno),
                     "); install kregd-exec next to kregd or set "
                     "executor_binary"));
  }
  return binary;
}

// What the config says of executors (adoption aside).
absl::StatusOr<PoolOptions> PoolOptionsOf(const Config& c) {
  PoolOptions pool;
  // ParseConfig checked it and made it lower case.
  pool.isolation = c.isolation == "uid"      ? Isolation::kUid
                   : c.isolation == "client" ? Isolation::kClient
                                             : Isolation::kShared;
  KREG_ASSIGN_OR_RETURN(pool.binary, ExecutorBinary(c));
  pool.launch_timeout_ms = static_cast<int64_t>(c.launch_timeout_s * 1000.0);
  pool.idle_ms = c.executor_idle_s * 1000;
  pool.slots = static_cast<uint32_t>(std::max(1, c.max_sessions));
  pool.init.set_max_arena_bytes(c.max_arena_bytes);
  pool.init.set_max_states_per_session(c.max_states_per_session);
  pool.init.set_max_message_bytes(64ull << 20);
  pool.init.set_max_buffered_bytes(c.max_buffered_bytes);
  pool.init.set_max_module_bytes(c.max_module_bytes);
  pool.init.set_hello_timeout_ms(
      static_cast<int64_t>(c.hello_timeout_s * 1000.0));
  pool.init.set_open_cuda(true);
  pool.init.set_seccomp(c.seccomp);
  pool.init.set_log_level(c.log_level);
  pool.init.set_launch_ring_off(!c.launch_ring);
  pool.init.set_ring_spin_us(c.ring_spin_us);
  pool.init.set_orphan_timeout_s(c.orphan_timeout_s);
  if (const char* env = std::getenv("KREGD_SESSION_SPIN_US")) {
    pool.init.set_spin_us(std::atoll(env));
  }
  return pool;
}

// The session socket's path: under socket activation the inherited
// socket's (`listen_fd`; the configured path may not exist then).
std::string SessionPathOf(const Config& c, int listen_fd) {
  std::string path = SessionSocketPath(c.socket_path);
  if (listen_fd < 0) return path;
  sockaddr_un addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0 &&
      addr.sun_family == AF_UNIX && addr.sun_path[0] != '\0') {
    path.assign(addr.sun_path, strnlen(addr.sun_path, sizeof(addr.sun_path)));
  }
  return path;
}

// Says at start how executors run: as whom, with or without seccomp, and
// whether clients may run kernels themselves.
void LogExecutorPolicy(const Config& c) {
  if (::geteuid() != 0) {
    spdlog::warn(
        "kregd is not root: executors run as kregd's uid {}, not as their "
        "callers' (isolation {})",
        ::geteuid(), c.isolation);
  } else {
    spdlog::info("executors: isolation {}", c.isolation);
  }
  if (!c.seccomp) {
    spdlog::warn(
        "seccomp = false: executors run kernels without the seccomp filter "
        "(execve, ptrace, network sockets, ... are allowed); remove the "
        "setting unless you are debugging the filter");
  }
  if (c.local_execution == "allow") {
    spdlog::info(
        "local execution: allowed (clients may run registered "
        "kernels in their own process; local_execution = \"deny\" "
        "keeps every kernel in executors)");
  } else {
    spdlog::info("local execution: denied (local_execution = \"deny\")");
  }
  if (c.replace == "owner") {
    spdlog::info(
        "replace = \"owner\": a target's owner or root may replace it with "
        "replace=true; the processes that have it bound switch within "
        "replace_timeout ({} s; docs/replace.md)",
        c.replace_timeout_s);
  }
}

}  // namespace

absl::Status Daemon::StartSessions() {
  // kregd runs no kernel and opens no GPU context itself (DESIGN §8): each
  // executor opens the devices it serves when it starts.
  KREG_ASSIGN_OR_RETURN(PoolOptions pool, PoolOptionsOf(config_));
  // Re-adoption (DESIGN §12): executors left running by this kregd offer
  // themselves to the next one on the supervision socket, next to the
  // session socket.
  const std::string supervision_path =
      SessionPathOf(config_, session_listen_fd_) + ".exec";
  AdoptionPolicy policy;
  if (config_.orphan_timeout_s > 0) {
    KREG_ASSIGN_OR_RETURN(std::string secret,
                          LoadAdoptionSecret(config_.state_dir));
    policy.secret = secret;
    policy.settings_digest = SettingsDigest(pool.init);
    policy.session_protocol_major = AdoptableProtocolMajor();
    policy.max_states_per_session = config_.max_states_per_session;
    pool.adoption_secret = secret;
    pool.init.set_supervision_socket(supervision_path);
    pool.init.set_settings_digest(policy.settings_digest);
  }
  pool_ = std::make_unique<ExecutorPool>(std::move(pool), &ledger_);
  LogExecutorPolicy(config_);
  FillBrokerContext();
  registry_.SetBindingOracle(&bindings_);
  // A replacement re-points the live holders (docs/replace.md sections 3-5).
  isolated_repointer_ =
      std::make_unique<IsolatedRepointer>(&bindings_, pool_.get(), &store_);
  repointers_.Add(isolated_repointer_.get());
  if (local_repointer_ != nullptr) repointers_.Add(local_repointer_.get());
  registry_.SetRepointer(&repointers_);
  SessionOptions opts;
  opts.socket_path = SessionSocketPath(config_.socket_path);
  opts.listen_fd = session_listen_fd_;
  opts.socket_gid = gid_;
  opts.max_sessions = config_.max_sessions;
  opts.max_sessions_per_uid = config_.max_sessions_per_uid;
  opts.account = &account_;
  opts.classify = true;
  sessions_ = std::make_unique<SessionServer>(
      opts,
      [ctx = broker_ctx_](uint64_t id, UniqueFd sock, const PeerCred& peer) {
        return std::make_shared<SessionBroker>(id, std::move(sock), peer, ctx);
      });
  KREG_RETURN_IF_ERROR(sessions_->Start());
  if (!policy.secret.empty()) StartReadopt(supervision_path, policy);
  return absl::OkStatus();
}

void Daemon::FillConfig(v1::GetConfigResponse* r) const {
  for (const ConfigEntry& e : DescribeConfig(config_)) {
    v1::ConfigValue* v = r->add_values();
    v->set_key(e.key);
    v->set_value_toml(e.value_toml);
    v->set_origin(e.origin);
  }
  r->set_toml(ConfigToml(config_));
  r->set_config_file(config_.config_file);
}

void Daemon::FillBrokerContext() {
  BrokerContext& ctx = broker_ctx_;
  ctx.registrar = &registrar_;
  ctx.control = HandleControl;
  ctx.registry = &registry_.core();
  ctx.store = &store_;
  ctx.pool = pool_.get();
  ctx.ledger = &ledger_;
  ctx.bindings = &bindings_;
  ctx.max_module_bytes = config_.max_module_bytes;
  ctx.account = &account_;
  ctx.heavy_work_wait_ms =
      static_cast<int64_t>(config_.probe_timeout_s * 1000.0);
  ctx.control_idle_timeout_ms =
      static_cast<int64_t>(config_.control_idle_timeout_s * 1000.0);
  // sessions_ is made after the context; it outlives every broker.
  ctx.not_a_session = [this](uint64_t id) {
    if (sessions_ != nullptr) sessions_->NotASession(id);
  };
  ctx.is_a_session = [this](uint64_t id) {
    return sessions_ != nullptr ? sessions_->IsASession(id) : absl::OkStatus();
  };
  ctx.local_binds = &local_binds_;
  ctx.hello_timeout_ms = static_cast<int64_t>(config_.hello_timeout_s * 1000.0);
  if (config_.local_execution != "allow") return;
  const bool tampered = TamperLocalModulesForTest();
  if (tampered) {
    spdlog::warn(
        "this kregd (kregd_tamper_local, a test binary) corrupts the modules "
        "it hands out for local execution on purpose");
  }
  local_modules_ = std::make_unique<LocalModuleCache>(
      &store_, config_.max_local_module_memory_bytes, config_.max_module_bytes,
      tampered);
  ctx.local_modules = local_modules_.get();
  // Local binds are replaceable: the shims watch for Repoint notices
  // (docs/replace.md section 4).
  if (config_.replace == "owner") {
    local_repointer_ = std::make_unique<LocalRepointer>(
        &bindings_, local_modules_.get(),
        static_cast<size_t>(config_.max_watch_connections_per_uid), &account_);
    ctx.local_repointer = local_repointer_.get();
  }
}

void Daemon::StartReadopt(const std::string& supervision_path,
                          const AdoptionPolicy& policy) {
  spdlog::info(
      "executors speak session protocol {}.{}; executors an earlier kregd "
      "left running are re-adopted when theirs has major {}",
      AdoptableProtocolMajor(), AdoptableProtocolMinor(),
      AdoptableProtocolMajor());
  readopt_ = std::make_unique<ReadoptListener>(
      supervision_path, policy,
      [this](ReadoptOffer offer, const std::function<bool()>& confirm) {
        return Readopt(std::move(offer), confirm);
      });
  if (absl::Status s = readopt_->Start(); !s.ok()) {
    // Serving goes on; only the next restart cannot re-adopt what this
    // kregd leaves running.
    spdlog::warn(
        "supervision: {}; executors this kregd leaves running cannot be "
        "re-adopted by the next one (they serve their sessions until those "
        "close, at most orphan_timeout)",
        std::string(s.message()));
    readopt_.reset();
  }
}

absl::Status Daemon::Readopt(ReadoptOffer offer,
                             const std::function<bool()>& confirm) {
  const v1::ExecReadopt& h = offer.header;
  v1::ExecInitReply info;
  info.set_uid(h.uid());
  info.set_gid(h.gid());
  info.set_cuda_status(h.cuda_status());
  info.set_seccomp(h.seccomp());
  KREG_ASSIGN_OR_RETURN(std::unique_ptr<Executor> exec,
                        Executor::Readopt(h.pid(), std::move(offer.control),
                                          *std::move(offer.page), info));
  std::vector<ReadoptedSession> sessions;
  for (const ReadoptOffer::Session& s : offer.sessions) {
    ReadoptedSession r;
    r.session_id = sessions_->NextId();
    r.slot = s.slot;
    r.peer = s.peer;
    for (const auto& [key, token] : s.tokens) {
      r.tokens.emplace_back(registry_.Lookup(key), token);
    }
    sessions.push_back(std::move(r));
  }
  KREG_ASSIGN_OR_RETURN(
      std::vector<ExecutorPool::Binding> bound,
      pool_->Readopt(std::move(exec), h.group(), sessions, confirm));
  for (size_t i = 0; i < sessions.size(); ++i) {
    const ReadoptedSession& r = sessions[i];
    ExecutorPool::Binding& b = (bound)[i];
    b.broker = std::move(offer.sessions[i].broker);
    for (size_t t = 0; t < r.tokens.size(); ++t) {
      if (r.tokens[t].first == nullptr) continue;
      bindings_.Add(r.session_id, r.peer, offer.sessions[i].tokens[t].first,
                    /*local=*/r.tokens[t].second == 0);
    }
    auto broker = std::make_shared<SessionBroker>(
        r.session_id, std::move(offer.sessions[i].client), r.peer, broker_ctx_,
        std::move(b));
    broker->KeepStates(offer.sessions[i].states);
    sessions_->Serve(std::move(broker), r.peer.uid);
  }
  // Its sessions may run an older generation of a target replaced while no
  // kregd supervised the executor (docs/replace.md section 5): re-point them
  // (the executor has its OK and reads its control socket again; a session
  // already at the generation changes nothing).
  std::set<const TargetEntry*> seen;
  for (const ReadoptedSession& r : sessions) {
    for (const auto& [entry, token] : r.tokens) {
      if (entry == nullptr || token == 0 || entry->generation < 2 ||
          !seen.insert(entry.get()).second) {
        continue;
      }
      const size_t late =
          isolated_repointer_
              ->Repoint(*entry,
                        absl::Now() + absl::Seconds(config_.replace_timeout_s))
              .size();
      if (late != 0) {
        spdlog::warn(
            "re-adopted executor pid {}: {} of its sessions did not switch {} "
            "to generation {} within replace_timeout",
            h.pid(), late, Named(entry->key), entry->generation);
      }
    }
  }
  return absl::OkStatus();
}

void Daemon::StopSessions() {
  // No executor may offer itself to a kregd that is going away.
  if (readopt_ != nullptr) readopt_->Stop();
  // Executors first: they end their sessions, so the brokers return.
  if (pool_ != nullptr) pool_->Shutdown();
  if (sessions_ != nullptr) sessions_->Stop();
}

void Daemon::FillSessionStatus(v1::GetStatusResponse* r) {
  if (sessions_ == nullptr || pool_ == nullptr) return;
  r->set_sessions(static_cast<uint32_t>(sessions_->sessions()));
  PoolCounters c = pool_->counters();
  r->set_launches(c.launches);
  r->set_launch_errors(c.launch_errors);
  r->set_isolation(config_.isolation);
  r->set_executors_started(c.executors_started);
  r->set_executor_crashes(c.executor_crashes);
  r->set_seccomp(config_.seccomp);
  if (::geteuid() != 0) {
    r->set_executor_note(
        absl::StrCat("kregd is not root: executors run as kregd's uid ",
                     ::geteuid(), ", not as their callers'"));
  }
  for (const ExecutorInfo& e : pool_->List()) {
    v1::ExecutorStatus* s = r->add_executors();
    s->set_pid(e.pid);
    s->set_group(e.group);
    s->set_uid(e.uid);
    s->set_gid(e.gid);
    s->set_sessions(static_cast<uint32_t>(e.sessions));
    s->set_launches(e.launches);
  }
  uint32_t quarantined = 0;
  for (const CrashRecord& row : ledger_.Rows()) quarantined += row.quarantined;
  r->set_quarantined(quarantined);
  for (v1::TargetStats& t : CurrentTargetStats()) {
    *r->add_target_stats() = std::move(t);
  }
}

}  // namespace kreg
