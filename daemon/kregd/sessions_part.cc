// kregd's sessions part (parts.h): the executor pool, the session server
// and its brokers, the re-pointers and the supervision socket.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/paths.h"
#include "common/status_macros.h"
#include "daemon/api/control_requests.h"
#include "daemon/api/session_server.h"
#include "daemon/base/adoption.h"
#include "daemon/base/platform_table.h"
#include "daemon/kregd/parts.h"
#include "daemon/supervisor/executor.h"
#include "daemon/supervisor/executor_pool.h"
#include "spdlog/spdlog.h"

namespace kreg {
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

SessionsPart::SessionsPart(DaemonCore* core)
    : core_(core), config_(core->config) {}

SessionsPart::~SessionsPart() = default;

size_t SessionsPart::open_sessions() const {
  return sessions_ != nullptr ? sessions_->sessions() : 0;
}

absl::Status SessionsPart::Start() {
  // kregd runs no kernel and opens no GPU context itself (DESIGN §8): each
  // executor opens the devices it serves when it starts.
  KREG_ASSIGN_OR_RETURN(PoolOptions pool, PoolOptionsOf(config_));
  // Re-adoption (DESIGN §12): executors left running by this kregd offer
  // themselves to the next one on the supervision socket, next to the
  // session socket.
  const std::string supervision_path =
      SessionPathOf(config_, core_->session_listen_fd) + ".exec";
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
  pool_ = std::make_unique<ExecutorPool>(std::move(pool), &core_->ledger);
  LogExecutorPolicy(config_);
  FillBrokerContext();
  core_->registry.SetBindingOracle(&core_->bindings);
  // A replacement re-points the live holders (docs/replace.md sections 3-5).
  isolated_repointer_ = std::make_unique<IsolatedRepointer>(
      &core_->bindings, pool_.get(), &core_->store);
  repointers_.Add(isolated_repointer_.get());
  if (local_repointer_ != nullptr) repointers_.Add(local_repointer_.get());
  core_->registry.SetRepointer(&repointers_);
  SessionOptions opts;
  opts.socket_path = SessionSocketPath(config_.socket_path);
  opts.listen_fd = core_->session_listen_fd;
  opts.socket_gid = core_->gid;
  opts.max_sessions = config_.max_sessions;
  opts.max_sessions_per_uid = config_.max_sessions_per_uid;
  opts.account = &core_->account;
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

void SessionsPart::FillBrokerContext() {
  BrokerContext& ctx = broker_ctx_;
  ctx.registrar = &core_->registrar;
  ctx.control = HandleControl;
  ctx.registry = &core_->registry.core();
  ctx.store = &core_->store;
  ctx.pool = pool_.get();
  ctx.ledger = &core_->ledger;
  ctx.bindings = &core_->bindings;
  ctx.max_module_bytes = config_.max_module_bytes;
  ctx.account = &core_->account;
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
  ctx.local_binds = &core_->local_binds;
  ctx.hello_timeout_ms = static_cast<int64_t>(config_.hello_timeout_s * 1000.0);
  if (config_.local_execution != "allow") return;
  const bool tampered = TamperLocalModulesForTest();
  if (tampered) {
    spdlog::warn(
        "this kregd (kregd_tamper_local, a test binary) corrupts the modules "
        "it hands out for local execution on purpose");
  }
  local_modules_ = std::make_unique<LocalModuleCache>(
      &core_->store, config_.max_local_module_memory_bytes,
      config_.max_module_bytes, tampered);
  ctx.local_modules = local_modules_.get();
  // Local binds are replaceable: the shims watch for Repoint notices
  // (docs/replace.md section 4).
  if (config_.replace == "owner") {
    local_repointer_ = std::make_unique<LocalRepointer>(
        &core_->bindings, local_modules_.get(),
        static_cast<size_t>(config_.max_watch_connections_per_uid),
        &core_->account);
    ctx.local_repointer = local_repointer_.get();
  }
}

void SessionsPart::StartReadopt(const std::string& supervision_path,
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

absl::Status SessionsPart::Readopt(ReadoptOffer offer,
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
      r.tokens.emplace_back(core_->registry.Lookup(key), token);
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
      core_->bindings.Add(r.session_id, r.peer,
                          offer.sessions[i].tokens[t].first,
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

void SessionsPart::Quiesce() {
  // No executor may offer itself to a kregd that is going away.
  if (readopt_ != nullptr) readopt_->Stop();
}

void SessionsPart::Stop() {
  // Executors first: they end their sessions, so the brokers return.
  if (pool_ != nullptr) pool_->Shutdown();
  if (sessions_ != nullptr) sessions_->Stop();
  if (pool_ != nullptr && pool_->leaving()) {
    // Threads still wait for the executors left serving their sessions
    // (DESIGN §12): the pool outlives them, until the process exits.
    (void)pool_.release();
    left_executors_ = true;
  }
}

void SessionsPart::FillStatus(v1::GetStatusResponse* r) {
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
  for (const CrashRecord& row : core_->ledger.Rows())
    quarantined += row.quarantined;
  r->set_quarantined(quarantined);
  for (v1::TargetStats& t :
       CurrentTargetStats(pool_.get(), core_->registry.List())) {
    *r->add_target_stats() = std::move(t);
  }
}

void SessionsPart::ListSessions(v1::ListSessionsResponse* resp) {
  if (pool_ == nullptr) return;
  if (isolated_repointer_ != nullptr) isolated_repointer_->Refresh();
  std::map<uint64_t, std::vector<SessionBindings::Bound>> bound =
      core_->bindings.Snapshot();
  for (const BoundSession& b : pool_->Sessions()) {
    v1::SessionInfo* s = resp->add_sessions();
    s->set_session_id(b.session_id);
    s->set_pid(b.peer.pid);
    s->set_uid(b.peer.uid);
    s->set_gid(b.peer.gid);
    s->set_launches(b.launches);
    s->set_since_us(b.since_us);
    s->set_executor_pid(b.executor_pid);
    s->set_executor(b.executor);
    s->set_arena_bytes(b.arena_bytes);
    s->set_states(b.states);
    auto it = bound.find(b.session_id);
    if (it == bound.end()) continue;
    for (const SessionBindings::Bound& held : it->second) {
      v1::TargetRef* t = s->add_targets();
      t->set_target_name(held.key.name);
      t->set_platform(PlatformName(held.key.platform));
      t->set_mode(held.local ? "local" : "isolated");
      t->set_generation(held.generation);
    }
  }
}

}  // namespace kreg
