#include "client/shim/client.h"

#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "client/shim/cuda_session.h"
#include "client/shim/cuda_trace.h"
#include "common/generations.h"
#include "common/platforms.h"
#include "common/status_macros.h"

namespace kreg {
namespace shim {
namespace {

// How often an operation whose session or control connection broke (kregd
// restarted) is tried, each time on a fresh one: kregd may restart again
// meanwhile, and several idle sessions may be stale at once. Every such
// operation is idempotent in kregd (a registration too).
constexpr int kAttempts = 6;

std::atomic<pid_t> g_pid{0};

void RefreshPid() { g_pid.store(::getpid(), std::memory_order_relaxed); }

// This process's pid without a syscall per call (every launch asks):
// cached, and refreshed in a fork()ed child by a pthread_atfork handler.
pid_t CurrentPid() {
  static const bool registered = [] {
    RefreshPid();
    ::pthread_atfork(nullptr, nullptr, &RefreshPid);
    return true;
  }();
  (void)registered;
  return g_pid.load(std::memory_order_relaxed);
}

int DefaultMaxSessions() {
  unsigned n = std::thread::hardware_concurrency();
  return static_cast<int>(std::min(32u, std::max(4u, n)));
}

}  // namespace

std::string CanonicalPlatform(const std::string& platform) {
  if (int i = FindPlatform(platform); i >= 0) return PlatformAt(i).name;
  std::string p = platform;
  for (char& c : p) c = static_cast<char>(std::tolower(c));
  return p;
}

ClientStatus CheckGeneration(Client* client, const std::string& target,
                             const std::string& platform, uint32_t generation) {
  v1::ListTargetsResponse list;
  KREG_RETURN_IF_ERROR(client->List(&list));
  std::vector<uint32_t> have;
  for (const v1::Target& t : list.targets()) {
    if (t.target_name() != target || t.platform() != platform) continue;
    for (const v1::Generation& g : t.generations()) {
      if (g.generation() == generation) return ClientStatus::Ok();
      have.push_back(g.generation());
    }
    if (have.empty()) have.push_back(std::max<uint32_t>(t.generation(), 1));
    if (have.back() == generation) return ClientStatus::Ok();
  }
  return ClientStatus::Error(
      kNotFound, NoSuchGeneration(target, platform, generation, have));
}

ClientStatus OtherGeneration(const std::string& target,
                             const std::string& platform, uint32_t bound,
                             uint32_t wanted) {
  auto text = [](uint32_t g) {
    return g == 0 ? std::string("following its current generation")
                  : "pinned to generation " + std::to_string(g);
  };
  return ClientStatus::Error(
      kFailedPrecondition,
      "target \"" + target + "\" (" + platform +
          ") is already bound in this process " + text(bound) +
          ", so it cannot also be bound " + text(wanted) +
          ": XLA keeps the first handler registered under a name. Bind it "
          "once per process, or pin in another process");
}

Client::Client(std::string session_path)
    : path_(std::move(session_path)),
      max_sessions_(DefaultMaxSessions()),
      pid_(CurrentPid()) {}

Client::~Client() {
  std::thread watch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_watch_ = true;
    if (watch_pid_ == ::getpid()) {
      watch = std::move(watch_);
    } else if (watch_.joinable()) {
      new std::thread(std::move(watch_));  // a forked child's copy: not ours
    }
  }
  watch_cv_.notify_all();
  if (watch.joinable()) watch.join();
}

Client* Client::ForPath(const std::string& session_path) {
  static std::mutex mu;
  static auto* clients = new std::map<std::string, Client*>();
  std::lock_guard<std::mutex> lock(mu);
  Client*& c = (*clients)[session_path];
  if (c == nullptr) c = new Client(session_path);
  return c;
}

uint64_t Client::open_sessions() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<uint64_t>(open_);
}

ClientStatus Client::Acquire(std::unique_ptr<Conn>* out) {
  uint64_t epoch;
  bool replay;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (pid_ != CurrentPid()) {
      // A forked child must not share the parent's sessions: drop its
      // copies (closing them here leaves the parent's untouched).
      idle_.clear();
      open_ = 0;
      pid_ = CurrentPid();
    }
    cv_.wait(lock, [&] { return !idle_.empty() || open_ < max_sessions_; });
    if (!idle_.empty()) {
      *out = std::move(idle_.back());
      idle_.pop_back();
      return ClientStatus::Ok();
    }
    ++open_;
    epoch = epoch_;
    replay = replayed_epoch_ < epoch_;
  }
  std::unique_ptr<Conn> conn;
  ClientStatus s;
  for (int attempt = 0; attempt < 4; ++attempt) {
    conn.reset();
    s = OpenSession(&conn);
    if (s.ok() && replay) s = Replay(conn.get());
    // kregd went away again while the session was set up (a restart in
    // the middle of re-registering): the next kregd gets another one.
    if (s.ok() || conn == nullptr || !conn->broken() || conn->refused()) {
      break;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!s.ok()) {
    --open_;
    cv_.notify_one();
    return s;
  }
  if (replay) {
    replayed_epoch_ = std::max(replayed_epoch_, epoch);
    reconnects_.fetch_add(1);
  }
  conn->epoch = epoch;
  conn->pid = pid_;
  *out = std::move(conn);
  return ClientStatus::Ok();
}

ClientStatus Client::OpenSession(std::unique_ptr<Conn>* out, bool control) {
  ClientStatus s = Conn::Open(path_, out, control);
  if (s.ok()) {
    ever_connected_.store(true);
    max_module_bytes_.store((*out)->hello().max_module_bytes());
    return s;
  }
  // Only a kregd this process has talked to is waited for (it is
  // restarting); a first connection fails at once.
  if (s.code != kUnavailable || !ever_connected_.load()) return s;
  double timeout_s = 30;
  if (const char* env = std::getenv("KREG_RECONNECT_TIMEOUT")) {
    char* end = nullptr;
    double v = std::strtod(env, &end);
    if (end != env && *end == '\0' && v >= 0) timeout_s = v;
  }
  if (timeout_s <= 0) return s;
  if (!said_waiting_.exchange(true)) {
    fprintf(stderr,
            "kreg: kregd at %s is not answering (%s); waiting up to %g s for "
            "it to come back (KREG_RECONNECT_TIMEOUT)\n",
            path_.c_str(), s.message.c_str(), timeout_s);
  }
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  auto pause = std::chrono::milliseconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(250));
    out->reset();
    s = Conn::Open(path_, out, control);
    if (s.ok()) max_module_bytes_.store((*out)->hello().max_module_bytes());
    if (s.ok() || s.code != kUnavailable) return s;
  }
  s.message += " (kregd did not come back within " +
               std::to_string(static_cast<int64_t>(timeout_s)) +
               " s, KREG_RECONNECT_TIMEOUT)";
  return s;
}

void Client::Release(std::unique_ptr<Conn> conn) {
  if (conn->broken()) return Discard(std::move(conn));
  std::lock_guard<std::mutex> lock(mu_);
  if (conn->pid != pid_) return;  // opened before a fork: drop the copy
  if (conn->epoch < epoch_) {
    --open_;  // opened before the daemon went away
    conn.reset();
  } else {
    if (CudaConnStateAwaitsExecutor(conn->cuda_state)) {
      StartWatchLocked();
      watch_cv_.notify_one();
    }
    idle_.push_back(std::move(conn));
  }
  cv_.notify_one();
}

void Client::StartWatchLocked() {
  if (watch_pid_ == ::getpid() || stop_watch_) return;
  if (watch_.joinable()) {
    new std::thread(std::move(watch_));  // the parent's, before a fork
  }
  watch_pid_ = ::getpid();
  watch_ = std::thread([this] { WatchLoop(); });
}

void Client::WatchLoop() {
  std::vector<pollfd> fds;
  std::vector<const Conn*> watched;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto collect = [&] {
        fds.clear();
        watched.clear();
        if (pid_ != ::getpid()) return false;
        for (const std::unique_ptr<Conn>& c : idle_) {
          if (!CudaConnStateAwaitsExecutor(c->cuda_state)) continue;
          fds.push_back(pollfd{c->fd(), POLLIN, 0});
          watched.push_back(c.get());
        }
        return !fds.empty();
      };
      watch_cv_.wait_for(lock, std::chrono::seconds(1),
                         [&] { return stop_watch_ || collect(); });
      if (stop_watch_) return;
    }
    if (fds.empty()) continue;
    // POLLHUP/POLLERR come without asking.
    int n = ::poll(fds.data(), fds.size(), 100);
    if (n <= 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      std::unique_ptr<Conn> conn;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (auto it = idle_.begin(); it != idle_.end(); ++it) {
          if (it->get() != watched[i]) continue;
          conn = std::move(*it);
          idle_.erase(it);
          break;
        }
      }
      if (conn == nullptr) continue;  // a call took it meanwhile
      // A call may have used and returned it between the poll and now:
      // only what is still there is the end of the session.
      pollfd again{conn->fd(), POLLIN, 0};
      if (::poll(&again, 1, 0) <= 0) {
        Release(std::move(conn));
        continue;
      }
      ClientStatus why = conn->ReadEnd();
      Trace("idle session %llu ended: code %d %s",
            static_cast<unsigned long long>(conn->hello().session_id()),
            why.code, why.message.c_str());
      if (conn->ended()) Abandon(conn.get(), why, /*keep=*/true);
      Discard(std::move(conn));
    }
  }
}

ClientStatus Client::Abandon(Conn* conn, const ClientStatus& why, bool keep) {
  ClientStatus lost;
  AbandonCudaConnState(conn->cuda_state, [&](const std::string& device) {
    if (!lost.ok()) return;  // the first device's is enough
    lost = ClientStatus::Error(
        why.ok() ? kInternal : why.code,
        "kreg: the GPU work of an earlier forwarded CUDA call on " + device +
            " never completed, so its outputs were not written (their "
            "values are undefined); this call was not run. kregd said: " +
            (why.ok() ? std::string("its session ended") : why.message) +
            ". The next call runs on a fresh executor.");
    Trace("lost GPU work: %s", lost.message.c_str());
    // Kept before the stream is released: the process's next call (which
    // may follow at once) must see it.
    if (keep) KeepLostWork(lost);
  });
  return lost;
}

void Client::KeepLostWork(ClientStatus lost) {
  if (lost.ok()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!has_lost_work_.load()) {
    has_lost_work_.store(true);
    lost_work_ = std::move(lost);
  }
}

ClientStatus Client::TakeLostWork() {
  if (!has_lost_work_.load(std::memory_order_acquire)) {
    return ClientStatus::Ok();
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!has_lost_work_.load()) return ClientStatus::Ok();
  has_lost_work_.store(false);
  return std::move(lost_work_);
}

void Client::Discard(std::unique_ptr<Conn> conn) {
  std::vector<std::unique_ptr<Conn>> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (conn->pid != pid_) return;  // opened before a fork
    --open_;
    if (conn->epoch == epoch_) {
      // First to notice: every idle session talks to the same dead daemon.
      ++epoch_;
      open_ -= static_cast<int>(idle_.size());
      dropped.swap(idle_);
    }
    cv_.notify_all();
  }
  // Sessions are closed outside the lock.
}

ClientStatus Client::FreshControlLocked() {
  if (control_pid_ != CurrentPid()) {
    control_.reset();  // a forked child's copy: the parent's stays open
    control_pid_ = CurrentPid();
  }
  if (control_ != nullptr) {
    // kregd sends nothing unasked: anything readable is its end.
    pollfd p{control_->fd(), POLLIN, 0};
    if (!control_->broken() && ::poll(&p, 1, 0) == 0) return ClientStatus::Ok();
    control_.reset();
  }
  std::vector<Registration> registrations;
  {
    std::lock_guard<std::mutex> lock(reg_mu_);
    for (const auto& entry : registrations_) {
      registrations.push_back(entry.second);
    }
  }
  // kregd may go away again while they are made again (a restart in the
  // middle): the next kregd gets them all.
  ClientStatus s;
  for (int attempt = 0; attempt < 4; ++attempt) {
    std::unique_ptr<Conn> conn;
    s = OpenSession(&conn, /*control=*/true);
    if (!s.ok()) return s;
    for (const Registration& r : registrations) {
      v1::SessionResponse resp;
      s = CallRegister(conn.get(), r, max_module_bytes_.load(), &resp);
      if (!s.ok()) {
        s.message = "re-registering \"" + r.header.target_name() +
                    "\" with kregd after a reconnect failed: " + s.message;
        break;
      }
    }
    if (s.ok()) {
      control_ = std::move(conn);
      return s;
    }
    if (!conn->broken() || conn->refused()) break;
  }
  return s;
}

ClientStatus Client::WithControl(const std::function<ClientStatus(Conn*)>& op) {
  std::lock_guard<std::mutex> lock(control_mu_);
  ClientStatus s;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    KREG_RETURN_IF_ERROR(FreshControlLocked());
    s = op(control_.get());
    if (!control_->broken() || control_->refused()) return s;
    control_.reset();  // kregd went away meanwhile: once more, on a new one
  }
  return s;
}

ClientStatus Client::Replay(Conn* conn) {
  bool registered;
  {
    std::lock_guard<std::mutex> lock(reg_mu_);
    registered = !registrations_.empty();
  }
  // The registrations are held by the control connection: a kregd that
  // closed it (restarted) gets them again on a fresh one.
  if (registered) {
    KREG_RETURN_IF_ERROR(Ping());
  }
  // Local holds: the module already runs in this process; the new kregd
  // only has to know (retire refuses while it does). Not fatal: a kregd
  // that now denies local execution cannot take back what is loaded.
  std::map<std::pair<std::string, std::string>, uint32_t> holds;
  {
    std::lock_guard<std::mutex> lock(reg_mu_);
    holds = local_holds_;
  }
  for (const auto& [key, generation] : holds) {
    const auto& [target, platform] = key;
    v1::SessionRequest req;
    req.mutable_bind_local()->set_target_name(target);
    req.mutable_bind_local()->set_platform(platform);
    req.mutable_bind_local()->set_generation(generation);
    v1::SessionResponse resp;
    UniqueFd module;  // closed: the loaded copy stays
    ClientStatus s = conn->Call(&req, &resp, nullptr, 0, &module);
    if (!s.ok()) {
      if (conn->broken()) return s;
      fprintf(stderr,
              "kreg: kregd at %s did not re-record this process's local "
              "hold of \"%s\" (%s) after a reconnect: %s (the loaded "
              "module keeps running)\n",
              path_.c_str(), target.c_str(), platform.c_str(),
              s.message.c_str());
    }
  }
  return ClientStatus::Ok();
}

ClientStatus Client::BindLocal(const std::string& target,
                               const std::string& platform, uint32_t generation,
                               v1::BindLocalReply* out, UniqueFd* module) {
  ClientStatus s = WithConn([&](Conn* conn) {
    v1::SessionRequest req;
    req.mutable_bind_local()->set_target_name(target);
    req.mutable_bind_local()->set_platform(platform);
    req.mutable_bind_local()->set_generation(generation);
    v1::SessionResponse resp;
    module->reset();
    ClientStatus st = conn->Call(&req, &resp, nullptr, 0, module);
    if (st.ok()) *out = resp.bind_local();
    return st;
  });
  if (s.ok()) {
    std::lock_guard<std::mutex> lock(reg_mu_);
    local_holds_.emplace(std::make_pair(target, CanonicalPlatform(platform)),
                         generation);
  }
  return s;
}

ClientStatus Client::Instantiate(const ring::DescriptorView& d,
                                 uint64_t* handle) {
  std::string descriptor;
  ring::EncodeDescriptor(d, &descriptor);
  return WithConn([&](Conn* conn) {
    v1::SessionRequest req;
    req.mutable_instantiate()->set_descriptor(descriptor);
    v1::SessionResponse resp;
    ClientStatus st = conn->Call(&req, &resp);
    if (st.ok() && resp.instantiate().state() == 0) {
      st = ClientStatus::Error(kInternal,
                               "kregd answered Instantiate without a state");
    }
    if (st.ok()) *handle = resp.instantiate().state();
    return st;
  });
}

ClientStatus Client::StageCall(const ring::DescriptorView& d, uint32_t stage) {
  std::string descriptor;
  ring::EncodeDescriptor(d, &descriptor);
  return WithConn([&](Conn* conn) {
    // In XLA the stage runs after the previous execution's execute stage
    // ran on the host: an asynchronous ring launch of this session must
    // have run in the executor before the stage changes the state it read
    // (its error, if any, stays the session's next launch's).
    KREG_RETURN_IF_ERROR(conn->ReapAsync(true));
    v1::SessionRequest req;
    req.mutable_stage_call()->set_descriptor(descriptor);
    req.mutable_stage_call()->set_stage(stage);
    v1::SessionResponse resp;
    return conn->Call(&req, &resp);
  });
}

void Client::ReleaseState(uint64_t handle) {
  std::unique_ptr<Conn> conn;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pid_ != CurrentPid()) return;
    if (idle_.empty()) {
      // Every session is busy (or none is open): the next operation sends
      // it, bounded (a session that ends releases its states anyway).
      if (pending_releases_.size() < kMaxPendingReleases) {
        pending_releases_.push_back(handle);
        has_pending_releases_.store(true, std::memory_order_relaxed);
      }
      return;
    }
    conn = std::move(idle_.back());
    idle_.pop_back();
  }
  v1::SessionRequest req;
  req.mutable_release_state()->set_state(handle);
  v1::SessionResponse resp;
  conn->Call(&req, &resp);  // NOT_FOUND: its session ended meanwhile
  Release(std::move(conn));
}

void Client::SendPendingReleases(Conn* conn) {
  std::vector<uint64_t> handles;
  {
    std::lock_guard<std::mutex> lock(mu_);
    handles.swap(pending_releases_);
    has_pending_releases_.store(false, std::memory_order_relaxed);
  }
  for (uint64_t handle : handles) {
    v1::SessionRequest req;
    req.mutable_release_state()->set_state(handle);
    v1::SessionResponse resp;
    conn->Call(&req, &resp);  // NOT_FOUND: its session ended meanwhile
    if (conn->broken()) return;
  }
}

namespace {

// Said once per process: a re-run is harmless but should not be silent.
void SayRerunOnce(const std::string& target, const std::string& why) {
  static std::atomic<bool> said{false};
  if (said.exchange(true)) return;
  std::fprintf(stderr,
               "kreg: a forwarded call of \"%s\" was run again on a new kregd "
               "session (its outputs do not alias its inputs, so that cannot "
               "change a result): %s (said once per process)\n",
               target.c_str(), why.c_str());
}

}  // namespace

ClientStatus Client::WithConn(const std::function<ClientStatus(Conn*)>& op,
                              const Rerun* rerun) {
  ClientStatus s;
  ClientStatus lost;
  // Earlier launches' lost GPU work: part of this call's error, or the
  // next call's when this one succeeds (on a fresh session).
  struct Report {
    Client* client;
    ClientStatus* s;
    ClientStatus* lost;
    ~Report() {
      if (lost->ok()) return;
      if (s->ok()) {
        client->KeepLostWork(std::move(*lost));
      } else {
        s->message += " (and: " + lost->message + ")";
      }
    }
  } report{this, &s, &lost};
  // Several idle sessions may be stale at once (kregd restarted and left
  // their executor serving launches only: a request that needs kregd ends
  // each in turn), so a broken session is retried a few times, each time
  // on another one; Acquire waits for a kregd that is away.
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    std::unique_ptr<Conn> conn;
    s = Acquire(&conn);
    if (!s.ok()) return s;
    if (has_pending_releases_.load(std::memory_order_relaxed)) {
      SendPendingReleases(conn.get());
    }
    conn->ClearLaunchSent();
    s = op(conn.get());
    bool broken = conn->broken();
    bool refused = conn->refused();
    const bool sent = conn->launch_sent();
    // kregd's ABORTED refusal: another session's handler crashed the
    // executor while this call ran (this one was not at fault).
    const bool interrupted = refused && s.code == kAborted;
    // The executor went away during the call: earlier launches' GPU work
    // that an XLA stream still waits on will never complete.
    if (conn->ended() && lost.ok()) {
      lost = Abandon(conn.get(), s, /*keep=*/false);
    }
    Release(std::move(conn));
    // A stale session (kregd restarted, an idle executor was replaced) is
    // retried on a fresh one; kregd's own refusal (e.g. the executor
    // crashed running this very call) is final.
    if (!broken || (refused && !interrupted) || attempt == kAttempts - 1) {
      return s;
    }
    if (rerun != nullptr && sent) {
      if (rerun->outputs_alias_inputs) {
        s.message =
            "kreg: the call of \"" + rerun->target +
            "\" may have partly run and was not run again: " + s.message +
            ". Its outputs alias its inputs (input_output_aliases), "
            "so running it again could change the result; re-run "
            "the step from its inputs.";
        return s;
      }
      SayRerunOnce(rerun->target, s.message);
    }
  }
  return s;
}

ClientStatus Client::Ping() {
  return WithControl([](Conn*) { return ClientStatus::Ok(); });
}

ClientStatus Client::Register(const Registration& registration,
                              v1::RegisterTargetResponse* out) {
  ClientStatus s = WithControl([&](Conn* conn) {
    v1::SessionResponse resp;
    ClientStatus st =
        CallRegister(conn, registration, max_module_bytes_.load(), &resp);
    if (st.ok()) *out = resp.register_target();
    return st;
  });
  if (s.ok()) {
    const v1::RegisterTargetHeader& h = registration.header;
    std::lock_guard<std::mutex> lock(reg_mu_);
    registrations_[{h.target_name(), CanonicalPlatform(h.platform())}] =
        registration;
  }
  return s;
}

ClientStatus Client::List(v1::ListTargetsResponse* out) {
  return WithControl([&](Conn* conn) {
    v1::SessionRequest req;
    req.mutable_list();
    v1::SessionResponse resp;
    ClientStatus st = conn->Call(&req, &resp);
    if (st.ok()) *out = resp.list();
    return st;
  });
}

}  // namespace shim
}  // namespace kreg
