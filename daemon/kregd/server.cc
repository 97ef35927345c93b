#include "daemon/kregd/server.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "daemon/base/files.h"
#include "daemon/base/hosted_api.h"
#include "daemon/registry/runnable.h"
#include "daemon/supervisor/gpu_sharing.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

// The directories whose writers could stand in for kregd: the state
// directory (the adoption secret, the journal, the store) and its sockets'
// (whoever may write there can bind the supervision socket while kregd
// restarts and be offered executors and their clients' sessions). Each
// must be owned by kregd's uid or root and writable by its owner alone
// (a sticky 1777 directory like /tmp is not). FAILED_PRECONDITION naming
// the first that is not; with allow_insecure_dirs only a warning.
absl::Status CheckPrivateDirs(const Config& c, const std::string& socket) {
  const std::pair<const char*, std::string> dirs[] = {
      {"socket directory", DirOf(socket)}, {"state directory", c.state_dir}};
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

// The GPU sharing mode at start: a warning without MPS (DESIGN §8).
void LogGpuSharing() {
  MpsControl mps =
      ProbeMpsControl(MpsPipeDir(std::getenv("CUDA_MPS_PIPE_DIRECTORY")));
  GpuSharing sharing = DescribeGpuSharing(CudaLaunchStatus(), mps);
  if (std::string warning = GpuSharingWarning(sharing, mps); !warning.empty()) {
    spdlog::warn("{}", warning);
  } else {
    spdlog::info("GPU sharing: {} ({})", sharing.mode, sharing.note);
  }
}

}  // namespace

std::string SelfDir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  return DirOf(std::string(buf, static_cast<size_t>(n)));
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

DaemonCore::DaemonCore(Config c)
    : config(std::move(c)),
      started(std::chrono::steady_clock::now()),
      store(config.state_dir + "/modules"),
      loader(&store,
             HelperBinary(config.probe_binary, "kregd-probe", "executor"),
             config.probe_timeout_s),
      journal(config.state_dir + "/journal"),
      registry(
          &loader, &journal,
          RegistryLimits{
              config.max_registrations_per_uid, config.max_store_bytes_per_uid,
              static_cast<uid_t>(-1), config.replace == "owner",
              absl::Seconds(config.replace_timeout_s),
              static_cast<uint32_t>(config.max_generations_per_target)}),
      registrar(&registry.core(),
                ModulePolicy{config.allowed_roots, config.max_module_bytes,
                             HelperBinary(config.probe_binary, "kregd-probe",
                                          "executor")}),
      ledger(
          CrashPolicy{config.quarantine_crashes, config.quarantine_window_s}),
      account(UidLimitsOf(config)) {}

absl::Status DaemonCore::Open() {
  KREG_ASSIGN_OR_RETURN(gid, SocketGid(config.socket_group));
  KREG_RETURN_IF_ERROR(LockStateDir());
  return Replay();
}

absl::Status DaemonCore::LockStateDir() {
  // A user's own kregd that found no XDG variables lands on the system's
  // directories: say how to run one of its own.
  auto hint = [this](absl::Status st) {  // errno is still the failure's
    if ((errno != EACCES && errno != EPERM) || ::geteuid() == 0) return st;
    return absl::PermissionDeniedError(absl::StrCat(
        st.message(), "; kregd runs as uid ", ::geteuid(),
        ", which may not use the state directory ", config.state_dir,
        ": for a kregd of your own pass --state-dir and --socket (or set "
        "XDG_STATE_HOME and XDG_RUNTIME_DIR), or use the system kregd"));
  };
  absl::Status st = MakeDirs(config.state_dir, 0700);
  if (!st.ok()) return hint(st);
  std::string lock = config.state_dir + "/lock";
  lock_fd.reset(::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock_fd.ok())
    return hint(ErrnoError(absl::StrCat("cannot open ", lock)));
  if (::flock(lock_fd.get(), LOCK_EX | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("state directory ", config.state_dir,
                     " is in use by another kregd; one daemon per state "
                     "directory"));
  }
  return store.Init();
}

absl::Status DaemonCore::Replay() {
  KREG_ASSIGN_OR_RETURN(std::vector<TargetEntry> entries, journal.Open());
  int restored = 0;
  for (const TargetEntry& e : entries) {
    absl::Status st = registry.Restore(e);
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
      registry.CollectGarbage(PeerCred{::geteuid(), ::getegid(), ::getpid()});
  if (!swept.ok()) {
    spdlog::warn("module store: unreferenced files not removed at start: {}",
                 std::string(swept.status().message()));
  }
  for (const NameReservation& r : journal.reservations()) {
    registry.RestoreReservation(r);
  }
  // Quarantines survive restarts until `kregctl unquarantine`.
  for (const CrashRecord& q : journal.quarantines()) {
    ledger.Restore(q);
    spdlog::warn(
        "journal: target {} ({}) stays quarantined for uid {} (last: {}); "
        "`kregctl unquarantine {} --platform {}` lifts it",
        q.key.name, PlatformName(q.key.platform), q.uid, q.last_reason,
        q.key.name, PlatformName(q.key.platform));
  }
  ledger.SetSink([this](CrashRecord row, bool quarantined) {
    row.quarantined = quarantined;
    absl::Status st = journal.AppendQuarantine(row);
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

Daemon::Daemon(Config config)
    : core_(std::move(config)),
      cluster_(&core_),
      compile_(&core_, &cluster_),
      sessions_(&core_),
      metrics_(&core_, &compile_, &sessions_),
      grpc_(&core_, &cluster_, &compile_, &sessions_,
            [this](v1::GetStatusResponse* r) { FillStatus(r); }),
      parts_{&cluster_, &compile_, &sessions_, &metrics_, &grpc_} {}

Daemon::~Daemon() { Shutdown(); }

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
    if (n > 1) core_.session_listen_fd = SD_LISTEN_FDS_START + 1;
    // Report the socket actually served, not the configured default.
    sockaddr_un addr{};
    socklen_t len = sizeof(addr);
    if (::getsockname(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr),
                      &len) == 0 &&
        addr.sun_path[0] != '\0') {
      core_.serving_socket_path = addr.sun_path;
    }
    spdlog::info("serving on {} socket(s) inherited from systemd ({})", n,
                 core_.serving_socket_path);
    return absl::OkStatus();
  }
  KREG_RETURN_IF_ERROR(MakeDirs(DirOf(core_.config.socket_path), 0755));
  KREG_ASSIGN_OR_RETURN(
      UnixListener l,
      UnixListener::Bind(core_.config.socket_path, 0660, core_.gid, "socket"));
  listener_ = std::make_unique<UnixListener>(std::move(l));
  // Ours to poll and accept on; close-on-exec like every descriptor of
  // kregd, so no helper it starts holds the socket open after kregd ends.
  listen_fd_.reset(::fcntl(listener_->fd(), F_DUPFD_CLOEXEC, 0));
  core_.serving_socket_path = core_.config.socket_path;
  return absl::OkStatus();
}

absl::Status Daemon::Start() {
  KREG_RETURN_IF_ERROR(core_.Open());
  KREG_RETURN_IF_ERROR(Listen());
  core_.listen_fd = listen_fd_.get();
  KREG_RETURN_IF_ERROR(
      CheckPrivateDirs(core_.config, core_.serving_socket_path));
  for (DaemonPart* part : parts_) KREG_RETURN_IF_ERROR(part->Start());
  LogGpuSharing();
  stop_fd_.reset(::eventfd(0, EFD_CLOEXEC));
  uint64_t watchdog_us = 0;
  if (sd_watchdog_enabled(/*unset_environment=*/0, &watchdog_us) > 0) {
    watchdog_thread_ =
        std::thread([this, watchdog_us] { WatchdogLoop(watchdog_us / 2); });
  }
  sd_notifyf(0, "READY=1\nSTATUS=serving %zu targets on %s",
             core_.registry.List().size(), core_.serving_socket_path.c_str());
  spdlog::info("kregd {} serving {} (state {})", kKregVersion,
               core_.serving_socket_path, core_.config.state_dir);
  return absl::OkStatus();
}

void Daemon::WatchdogLoop(uint64_t interval_us) {
  while (!stopping_.load()) {
    // Liveness: the registry answers (its lock is not stuck).
    core_.registry.List();
    sd_notify(0, "WATCHDOG=1");
    pollfd p{stop_fd_.get(), POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(interval_us / 1000));
  }
}

void Daemon::FillStatus(v1::GetStatusResponse* r) {
  r->set_version(kKregVersion);
  r->set_uptime_s(std::chrono::duration_cast<std::chrono::seconds>(
                      std::chrono::steady_clock::now() - core_.started)
                      .count());
  const std::vector<EntryPtr> entries = core_.registry.List();
  r->set_targets(static_cast<uint32_t>(entries.size()));
  // Modules executors load: the distinct store copies registered targets
  // use (kregd itself loads none).
  std::set<std::string> modules;
  for (const EntryPtr& e : entries) {
    if (!e->module_digest.empty()) modules.insert(e->module_digest);
  }
  r->set_modules_loaded(static_cast<uint32_t>(modules.size()));
  r->set_registrations_refused(core_.registry.refused());
  r->set_state_dir(core_.config.state_dir);
  r->set_socket_path(core_.serving_socket_path);
  r->set_ffi_api_major(kHostedApiMajor);
  r->set_ffi_api_minor(kHostedApiMinor);
  r->set_max_module_bytes(core_.config.max_module_bytes);
  GpuSharing sharing = DescribeGpuSharing(
      CudaLaunchStatus(),
      ProbeMpsControl(MpsPipeDir(std::getenv("CUDA_MPS_PIPE_DIRECTORY"))));
  r->set_gpu_sharing(sharing.mode);
  r->set_gpu_sharing_note(sharing.note);
  for (DaemonPart* part : parts_) part->FillStatus(r);
}

void Daemon::Shutdown() {
  if (stopping_.exchange(true)) return;
  sd_notify(0, "STOPPING=1");
  if (stop_fd_.ok()) {
    uint64_t one = 1;
    (void)!::write(stop_fd_.get(), &one, sizeof(one));
  }
  if (watchdog_thread_.joinable()) watchdog_thread_.join();
  for (DaemonPart* part : parts_) part->Quiesce();
  for (auto it = parts_.rbegin(); it != parts_.rend(); ++it) (*it)->Stop();
  listener_.reset();  // removes the path unless a newer kregd took it
  spdlog::info("kregd stopped");
}

}  // namespace kreg
