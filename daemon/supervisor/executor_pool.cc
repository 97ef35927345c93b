#include "daemon/supervisor/executor_pool.h"

#include <pwd.h>
#include <signal.h>
#include <string.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "daemon/base/adoption.h"
#include "daemon/supervisor/crash_blame.h"
#include "daemon/supervisor/executor.h"
#include "daemon/supervisor/executor_group.h"
#include "spdlog/spdlog.h"

namespace kreg {

namespace {

int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

int64_t MonotonicMs() { return MonotonicNs() / 1000000; }

gid_t PrimaryGid(uid_t uid, gid_t fallback) {
  std::vector<char> buf(16384);
  passwd pw;
  passwd* found = nullptr;
  if (getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) != 0 ||
      found == nullptr) {
    return fallback;
  }
  return pw.pw_gid;
}

// `token` when kregd knows its entry, else 0 (nothing blamed on it): a
// re-adopted executor's tokens for targets that are not registered any
// more have no entry (DESIGN §12).
uint32_t KnownToken(const std::vector<EntryPtr>& resolved, uint32_t token) {
  if (token == 0 || token > resolved.size()) return token;
  return resolved[token - 1] == nullptr ? 0 : token;
}

}  // namespace

const char* IsolationName(Isolation isolation) {
  switch (isolation) {
    case Isolation::kUid:
      return "uid";
    case Isolation::kClient:
      return "client";
    case Isolation::kShared:
      return "shared";
  }
  return "?";
}

ExecutorPool::ExecutorPool(PoolOptions options, CrashLedger* ledger)
    : options_(std::move(options)), ledger_(ledger) {
  supervisor_ = std::thread([this] { Supervise(); });
  spawner_ = std::thread([this] { SpawnerLoop(); });
}

void ExecutorPool::SpawnerLoop() {
  for (;;) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&spawn_q_mu_);
      spawn_q_mu_.Await(absl::Condition(
          +[](ExecutorPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->spawn_q_mu_) {
            return p->spawner_stop_ || !p->spawn_q_.empty();
          },
          this));
      if (spawn_q_.empty()) return;
      fn = std::move(spawn_q_.front());
      spawn_q_.pop_front();
    }
    fn();
  }
}

bool ExecutorPool::OnSpawner(const std::function<void()>& fn) {
  bool done = false;
  absl::Mutex done_mu;
  {
    absl::MutexLock lock(&spawn_q_mu_);
    if (spawner_stop_) return false;  // shutting down: nothing starts
    spawn_q_.push_back([&] {
      fn();
      absl::MutexLock l(&done_mu);
      done = true;
    });
  }
  absl::MutexLock l(&done_mu);
  done_mu.Await(absl::Condition(&done));
  return true;
}

ExecutorPool::~ExecutorPool() { Shutdown(); }

std::string ExecutorPool::GroupKey(const PeerCred& peer) const {
  switch (options_.isolation) {
    case Isolation::kUid:
      return absl::StrCat("uid ", peer.uid);
    case Isolation::kClient:
      return absl::StrCat("pid ", peer.pid, " (uid ", peer.uid, ")");
    case Isolation::kShared:
      return "shared";
  }
  return "?";
}

absl::StatusOr<std::shared_ptr<ExecutorPool::Group>> ExecutorPool::Start(
    const std::string& key, const PeerCred& peer) {
  auto g = std::make_shared<Group>();
  g->key = key;
  g->name = key;
  v1::ExecInit init = options_.init;
  bool root = ::geteuid() == 0;
  if (root) {
    uid_t uid = peer.uid;
    gid_t gid = PrimaryGid(peer.uid, peer.gid);
    std::vector<gid_t> groups = GroupsOf(uid, gid);
    if (options_.isolation == Isolation::kShared) {
      // Everybody's kernels in one process: lend them nobody's rights.
      uid = gid = 65534;
      groups = {65534};
    }
    init.set_drop_privileges(true);
    init.set_uid(uid);
    init.set_gid(gid);
    for (gid_t x : groups) init.add_groups(x);
  } else {
    init.set_drop_privileges(false);
    init.set_uid(::geteuid());
    init.set_gid(::getegid());
  }
  init.set_group(key);
  init.set_parent_pid(::getpid());
  init.set_slots(options_.slots);
  if (!options_.adoption_secret.empty()) {
    AdoptionIdentity id;
    id.nonce.resize(kAdoptionNonceBytes);
    if (::getrandom(id.nonce.data(), id.nonce.size(), 0) !=
        static_cast<ssize_t>(id.nonce.size())) {
      return absl::UnavailableError(absl::StrCat(
          "getrandom for an executor's adoption nonce: ", strerror(errno)));
    }
    id.uid = init.uid();
    id.gid = init.gid();
    id.group = key;
    id.slots = options_.slots;
    id.settings_digest = init.settings_digest();
    init.set_adoption_nonce(id.nonce);
    init.set_adoption_key(AdoptionKey(options_.adoption_secret, id));
  }
  absl::StatusOr<std::unique_ptr<ExecutorProcess>> exec =
      absl::UnavailableError("kregd is shutting down");
  OnSpawner([&] {
    if (options_.launcher) {
      exec = options_.launcher(options_.binary, init, options_.start_timeout);
      return;
    }
    absl::StatusOr<std::unique_ptr<Executor>> real =
        Executor::Start(options_.binary, init, options_.start_timeout);
    if (real.ok()) {
      exec = std::unique_ptr<ExecutorProcess>(*std::move(real));
    } else {
      exec = real.status();
    }
  });
  if (!exec.ok()) return exec.status();
  g->exec = *std::move(exec);
  g->uid = g->exec->info().uid();
  g->gid = g->exec->info().gid();
  g->used.assign(options_.slots, false);
  g->slot_uid.assign(options_.slots, 0);
  g->slot_info.assign(options_.slots, SlotInfo{});
  g->idle_since_ms = MonotonicMs();
  spdlog::info("executor pid {} started for {} (uid {} gid {}{}{})",
               g->exec->pid(), key, g->uid, g->gid,
               root ? "" : ", kregd is not root: kregd's uid",
               g->exec->info().cuda_status().empty()
                   ? ""
                   : "; CUDA: " + g->exec->info().cuda_status());
  return g;
}

absl::StatusOr<ExecutorPool::Binding> ExecutorPool::Bind(uint64_t session_id,
                                                         int client_fd,
                                                         const PeerCred& peer) {
  const std::string key = GroupKey(peer);
  std::shared_ptr<Group> g;
  auto find = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    g = nullptr;
    auto it = groups_.find(key);
    if (it != groups_.end() && !it->second->dead &&
        !it->second->stop_requested) {
      g = it->second;
    }
  };
  Binding b;
  b.peer = peer;
  // The executor found may be stopped (idle) or die before a slot is
  // taken: then look again (a fresh one is started).
  for (int attempt = 0;; ++attempt) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return absl::UnavailableError("kregd is shutting down");
      find();
    }
    if (g == nullptr) {
      absl::MutexLock start(&start_mu_);
      {
        absl::MutexLock lock(&mu_);
        find();
      }
      if (g == nullptr) {
        KREG_ASSIGN_OR_RETURN(g, Start(key, peer));
        absl::MutexLock lock(&mu_);
        if (stopping_) return absl::UnavailableError("kregd is shutting down");
        groups_[key] = g;
        dead_counters_.executors_started++;
        Admit(g);
      }
    }
    absl::MutexLock lock(&mu_);
    if (g->dead || g->stop_requested) {
      if (attempt < 3) continue;
      return absl::UnavailableError(absl::StrCat(
          "the executor for ", g->name, " keeps going away; see kregd's log"));
    }
    uint32_t slot = 0;
    while (slot < g->used.size() && g->used[slot]) ++slot;
    if (slot == g->used.size()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the executor for ", g->name, " already serves ", g->used.size(),
          " sessions (its limit, max_sessions); close idle sessions"));
    }
    g->used[slot] = true;
    g->slot_uid[slot] = peer.uid;
    g->slot_info[slot] = {session_id, peer, NowMicros()};
    g->sessions++;
    ExecSlot* s = g->exec->page().slot(slot);
    s->token.store(0);
    s->request_id.store(0);
    s->launches.store(0);
    s->arena_bytes.store(0);
    s->states.store(0);
    b.slot = slot;
    b.group = g;
    break;
  }
  v1::ExecAdopt adopt;
  adopt.set_session_id(session_id);
  adopt.set_uid(peer.uid);
  adopt.set_gid(peer.gid);
  adopt.set_pid(peer.pid);
  adopt.set_slot(b.slot);
  absl::StatusOr<UniqueFd> broker = g->exec->Adopt(adopt, client_fd);
  if (!broker.ok()) {
    Release(&b);
    return broker.status();
  }
  b.broker = *std::move(broker);
  return b;
}

void ExecutorPool::Admit(const std::shared_ptr<Group>& g) {
  unreaped_.insert(g);
  auto done = std::make_shared<std::atomic<bool>>(false);
  waiters_.push_back({std::thread([this, g, done] {
                        Wait(g);
                        done->store(true);
                      }),
                      done});
}

absl::StatusOr<std::vector<ExecutorPool::Binding>> ExecutorPool::Readopt(
    std::unique_ptr<ExecutorProcess> exec, const std::string& group,
    const std::vector<ReadoptedSession>& sessions,
    const std::function<bool()>& confirm) {
  const uint32_t slots = exec->page().slots();
  std::vector<bool> used(slots, false);
  for (const ReadoptedSession& s : sessions) {
    if (s.slot >= slots || used[s.slot]) {
      exec->Abandon();
      return absl::InvalidArgumentError(
          absl::StrCat("it offers session slot ", s.slot,
                       " twice or out of range (", slots, " slots)"));
    }
    used[s.slot] = true;
    if (GroupKey(s.peer) != group) {
      exec->Abandon();  // it drains itself
      return absl::FailedPreconditionError(absl::StrCat(
          "it serves \"", group, "\", but under isolation ",
          IsolationName(options_.isolation), " its session of pid ", s.peer.pid,
          " (uid ", s.peer.uid, ") belongs to \"", GroupKey(s.peer), "\""));
    }
  }
  auto g = std::make_shared<Group>();
  g->name = group;
  g->exec = std::move(exec);
  g->uid = g->exec->info().uid();
  g->gid = g->exec->info().gid();
  g->used = used;
  g->slot_uid.assign(slots, 0);
  g->slot_info.assign(slots, SlotInfo{});
  g->idle_since_ms = MonotonicMs();
  for (const ReadoptedSession& s : sessions) {
    g->slot_uid[s.slot] = s.peer.uid;
    g->slot_info[s.slot] = {s.session_id, s.peer, NowMicros()};
    for (const auto& [entry, token] : s.tokens) {
      if (token == 0 || token > kStatsRows) continue;
      if (g->resolved.size() < token) g->resolved.resize(token);
      if (g->resolved[token - 1] == nullptr) g->resolved[token - 1] = entry;
    }
  }
  g->sessions = static_cast<int>(sessions.size());
  absl::MutexLock lock(&mu_);
  // Refused: the executor is not ours to stop (nor to wait for).
  auto refuse = [&](absl::Status why) {
    g->exec->Abandon();
    return why;
  };
  if (stopping_)
    return refuse(absl::UnavailableError("kregd is shutting down"));
  for (const std::shared_ptr<Group>& other : unreaped_) {
    if (other->exec->pid() == g->exec->pid()) {
      return refuse(absl::AlreadyExistsError(absl::StrCat(
          "this kregd supervises executor pid ", g->exec->pid(), " already")));
    }
  }
  if (!confirm()) {
    return refuse(absl::UnavailableError(absl::StrCat(
        "executor pid ", g->exec->pid(), " went away while offering itself")));
  }
  auto it = groups_.find(group);
  if (it == groups_.end() || it->second->dead || it->second->stop_requested) {
    g->key = group;
    groups_[group] = g;
  } else {
    // Serves its own sessions only: Bind never finds this key.
    g->key = absl::StrCat(group, " (re-adopted pid ", g->exec->pid(), ")");
    groups_[g->key] = g;
  }
  Admit(g);
  std::vector<Binding> out;
  for (const ReadoptedSession& s : sessions) {
    Binding b;
    b.group = g;
    b.slot = s.slot;
    b.peer = s.peer;
    out.push_back(std::move(b));
  }
  spdlog::info(
      "re-adopted executor pid {} ({}, uid {} gid {}) with {} session(s) "
      "that an earlier kregd left running",
      g->exec->pid(), group, g->uid, g->gid, sessions.size());
  return out;
}

uint32_t ExecutorPool::TokenFor(const Binding& b, EntryPtr entry) {
  absl::MutexLock lock(&mu_);
  return TokenIn(&b.group->resolved, std::move(entry));
}

void ExecutorPool::Release(Binding* b) {
  if (b->group == nullptr) return;
  absl::MutexLock lock(&mu_);
  Group* g = b->group.get();
  if (b->slot < g->used.size() && g->used[b->slot]) {
    g->used[b->slot] = false;
    if (--g->sessions == 0) g->idle_since_ms = MonotonicMs();
  }
  b->group.reset();
}

absl::Status ExecutorPool::AwaitCrash(Binding* b, bool request_pending) {
  std::shared_ptr<Group> g = b->group;
  if (g == nullptr) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  // `blamed` (not `dead`): Wait fills crash_text and death_note after the
  // executor is reaped, outside mu_, then sets it.
  for (int round = 0; round < 2 && !g->blamed; ++round) {
    absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (!g->blamed) {
      if (changed_.WaitWithDeadline(&mu_, deadline)) break;
    }
    if (!g->dead) {
      if (g->killed_because.empty()) {
        g->killed_because = absl::StrCat(
            "it closed the broker socket of session slot ", b->slot,
            " without ending the session and did not exit within 5 s, so "
            "kregd killed it");
      }
      spdlog::warn("killing executor pid {} ({}): {}", g->exec->pid(), g->name,
                   g->killed_because);
      g->exec->Signal(SIGKILL);
    }
  }
  auto it = g->crash_text.find(b->slot);
  if (it != g->crash_text.end()) return it->second;
  if (request_pending && g->dead && !g->death_note.empty()) {
    return absl::InternalError(absl::StrCat(
        g->death_note,
        " before it read this session's request, so the call did not run. "
        "kregd and your registrations are unaffected; the next call starts "
        "a fresh executor."));
  }
  return absl::OkStatus();
}

pid_t ExecutorPool::CountRefusedBrokerMessage(const Binding& b) {
  absl::MutexLock lock(&mu_);
  ++broker_messages_refused_;
  return b.group == nullptr ? 0 : b.group->exec->pid();
}

struct ExecutorPool::Death {
  BlameInput in;
  ExecutorEnd end;
  std::vector<EntryPtr> resolved;
  std::vector<uid_t> slot_uid;
  bool planned = false;  // kregd stopped it and it exited 0
  std::string how;       // DescribeEnd's text
  ExecutorName name;
};

void ExecutorPool::Wait(std::shared_ptr<Group> g) {
  const int ws = g->exec->Reap();
  Death d;
  Detach(g, &d);
  const StatusPage& page = g->exec->page();
  d.in.resolved = static_cast<uint32_t>(d.resolved.size());
  d.in.faulted_slot = page.header()->faulted_slot.load();
  d.in.gpu_fault = page.header()->recycle.load() == 2;
  d.end.wait_text = DescribeWaitStatus(ws);
  d.end.sigkill = WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL;
  d.end.note = page.Note();
  d.planned = d.end.stop_requested && WIFEXITED(ws) && WEXITSTATUS(ws) == 0;
  d.how = DescribeEnd(d.end);
  d.name = ExecutorName{g->exec->pid(), g->name};
  size_t counted = 0;
  std::map<uint32_t, absl::Status> texts = Blame(d, &counted);
  Publish(g.get(), d, texts, counted);
  for (const auto& [slot, status] : texts) {
    if (status.code() == absl::StatusCode::kAborted) {
      spdlog::warn("{}", std::string(status.message()));
    } else {
      spdlog::error("{}", std::string(status.message()));
    }
  }
  if (texts.empty() && !d.planned) {
    spdlog::warn("executor pid {} ({}): {} with no call in flight", d.name.pid,
                 d.name.group, d.how);
  } else if (d.planned) {
    spdlog::info("executor pid {} ({}) stopped", d.name.pid, d.name.group);
  }
}

void ExecutorPool::Detach(const std::shared_ptr<Group>& g, Death* d) {
  const StatusPage& page = g->exec->page();
  absl::MutexLock lock(&mu_);
  g->dead = true;
  auto it = groups_.find(g->key);
  if (it != groups_.end() && it->second == g) groups_.erase(it);
  if (unreaped_.erase(g) != 0) {
    const SessionCounters& n = page.header()->counters;
    dead_counters_.launches =
        SaturatingAdd(dead_counters_.launches, n.launches.load());
    dead_counters_.launch_errors =
        SaturatingAdd(dead_counters_.launch_errors, n.launch_errors.load());
    AddGroupStats(*g, &dead_stats_);
  }
  d->in.slots.resize(g->used.size());
  for (uint32_t i = 0; i < g->used.size(); ++i) {
    if (!g->used[i]) continue;
    d->in.slots[i].used = true;
    d->in.slots[i].token = KnownToken(g->resolved, page.slot(i)->token.load());
    d->in.slots[i].gpu_token =
        KnownToken(g->resolved, page.slot(i)->gpu_token.load());
  }
  d->resolved = g->resolved;
  d->slot_uid = g->slot_uid;
  d->in.stop_requested = d->end.stop_requested = g->stop_requested;
  d->end.killed_because = g->killed_because;
}

std::map<uint32_t, absl::Status> ExecutorPool::Blame(const Death& d,
                                                     size_t* crashes_counted) {
  const CrashBlame blame = DecideBlame(d.in);
  const int64_t now_s = static_cast<int64_t>(::time(nullptr));
  std::map<uint32_t, absl::Status> texts;
  std::set<std::pair<std::string, uid_t>> counted;
  const TargetEntry* culprit =
      blame.culprit >= 0 ? d.resolved[d.in.slots[blame.culprit].token - 1].get()
                         : nullptr;
  for (const SlotBlame& b : blame.slots) {
    const TargetEntry& e = *d.resolved[b.token - 1];
    std::string quarantine;
    if (b.counted) {
      const uid_t uid = d.slot_uid[b.slot];
      CrashRecord rec = ledger_->Record(e.key, uid, d.how, now_s);
      counted.insert({e.key.name, uid});
      quarantine = QuarantineNote(rec, ledger_->policy());
    }
    texts[b.slot] =
        CrashError(b, e, culprit, d.name, d.how, blame.gpu_only, quarantine);
  }
  *crashes_counted = counted.size();
  return texts;
}

void ExecutorPool::Publish(Group* g, const Death& d,
                           const std::map<uint32_t, absl::Status>& texts,
                           size_t crashes_counted) {
  const bool idle_death = texts.empty() && !d.planned;
  absl::MutexLock lock(&mu_);
  dead_counters_.executor_crashes += crashes_counted;
  // Counted like a crash: an executor that dies (or that kregd kills) with
  // no handler running is as gone as one a handler killed.
  if (idle_death && !d.end.stop_requested) dead_counters_.executor_crashes++;
  if (!d.planned && !d.end.stop_requested) {
    g->death_note = absl::StrCat(
        "the kregd executor serving this session "
        "(pid ",
        d.name.pid, ", ", d.name.group, ") ended: ", d.how, ",");
  }
  g->crash_text = texts;
  g->blamed = true;
  changed_.SignalAll();
}

void ExecutorPool::Supervise() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    changed_.WaitWithTimeout(&mu_, absl::Milliseconds(100));
    if (stopping_) break;
    for (auto w = waiters_.begin(); w != waiters_.end();) {
      if (!w->done->load()) {
        ++w;
        continue;
      }
      w->thread.join();  // finished: returns at once
      w = waiters_.erase(w);
    }
    const int64_t now_ns = MonotonicNs();
    const int64_t now_ms = now_ns / 1000000;
    for (auto it = groups_.begin(); it != groups_.end();) {
      Group* g = it->second.get();
      if (options_.launch_timeout_ms > 0 && g->killed_because.empty()) {
        for (uint32_t i = 0; i < g->used.size(); ++i) {
          if (!g->used[i]) continue;
          ExecSlot* s = g->exec->page().slot(i);
          if (s->token.load() == 0) continue;
          int64_t ran_ms = (now_ns - s->started_ns.load()) / 1000000;
          if (ran_ms > options_.launch_timeout_ms) {
            g->killed_because =
                absl::StrCat("the call ran longer than launch_timeout (",
                             options_.launch_timeout_ms,
                             " ms) and kregd killed its executor");
            spdlog::warn(
                "killing executor pid {} ({}): session slot {} "
                "ran a call for {} ms, over launch_timeout ({} ms)",
                g->exec->pid(), g->name, i, ran_ms, options_.launch_timeout_ms);
            g->exec->Signal(SIGKILL);
            break;
          }
        }
      }
      if (g->sessions == 0 && now_ms - g->idle_since_ms > options_.idle_ms) {
        g->stop_requested = true;
        g->exec->RequestStop();
        it = groups_.erase(it);
        continue;
      }
      ++it;
    }
  }
}

std::vector<ExecutorInfo> ExecutorPool::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<ExecutorInfo> out;
  for (const auto& [key, g] : groups_) {
    ExecutorInfo info;
    info.pid = g->exec->pid();
    info.group = g->name;
    info.uid = g->uid;
    info.gid = g->gid;
    info.sessions = g->sessions;
    info.launches = g->exec->page().header()->counters.launches.load();
    out.push_back(info);
  }
  return out;
}

PoolCounters ExecutorPool::counters() const {
  absl::MutexLock lock(&mu_);
  PoolCounters c = dead_counters_;
  c.broker_messages_refused = broker_messages_refused_;
  for (const std::shared_ptr<Group>& g : unreaped_) {
    // Untrusted counts: saturate rather than wrap.
    const SessionCounters& n = g->exec->page().header()->counters;
    c.launches = SaturatingAdd(c.launches, n.launches.load());
    c.launch_errors = SaturatingAdd(c.launch_errors, n.launch_errors.load());
  }
  return c;
}

void ExecutorPool::Shutdown() {
  std::vector<Waiter> waiters;
  const bool leave = options_.init.orphan_timeout_s() > 0;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    int serving = 0;
    for (auto& [key, g] : groups_) {
      g->stop_requested = true;
      if (leave && g->sessions > 0) {
        // Its sessions' launches need no kregd: it serves them on and
        // exits when they close (at most orphan_timeout later).
        ++serving;
        g->exec->Abandon();
      } else {
        g->exec->RequestStop();
      }
    }
    if (serving > 0) {
      leaving_.store(true);
      spdlog::info(
          "leaving {} executor(s) running for their sessions: they exit when "
          "those close, at most orphan_timeout ({} s) from now",
          serving, options_.init.orphan_timeout_s());
    }
    changed_.SignalAll();
  }
  if (supervisor_.joinable()) supervisor_.join();
  {
    absl::MutexLock lock(&spawn_q_mu_);
    spawner_stop_ = true;
  }
  if (spawner_.joinable()) spawner_.join();
  if (leaving_.load()) {
    // The threads waiting for the left executors keep waiting (the pool
    // is never destroyed: Daemon leaks it); idle executors exit now.
    absl::MutexLock lock(&mu_);
    for (Waiter& w : waiters_) w.thread.detach();
    waiters_.clear();
    return;
  }
  {
    // Executors finish their sessions and exit; ones that do not are
    // killed by their destructor's grace period.
    absl::MutexLock lock(&mu_);
    absl::Time deadline = absl::Now() + absl::Seconds(3);
    while (!groups_.empty()) {
      if (changed_.WaitWithDeadline(&mu_, deadline)) break;
    }
    for (auto& [key, g] : groups_) {
      g->killed_because =
          "kregd is stopping and the executor did not exit within 3 s, so "
          "kregd killed it";
      spdlog::warn("killing executor pid {} ({}): {}", g->exec->pid(), g->name,
                   g->killed_because);
      g->exec->Signal(SIGKILL);
    }
    waiters.swap(waiters_);
  }
  for (Waiter& w : waiters) w.thread.join();
}

}  // namespace kreg
