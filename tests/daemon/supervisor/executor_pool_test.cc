// ExecutorPool over fake executors (executor_process.h): what a dead
// executor's sessions are told, and that recording a crash (the crash
// ledger's sink: kregd's journal, with its fsync) holds up no other caller
// of the pool.
#include "daemon/supervisor/executor_pool.h"

#include <signal.h>
#include <sys/socket.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "catch2/catch.hpp"

namespace kreg {
namespace {

using std::chrono::milliseconds;

// An executor that is a status page and a wait status the test sets.
class FakeExecutor final : public ExecutorProcess {
 public:
  FakeExecutor(pid_t pid, StatusPage page, uid_t uid)
      : pid_(pid), page_(std::move(page)) {
    info_.set_uid(uid);
    info_.set_gid(uid);
  }

  absl::StatusOr<UniqueFd> Adopt(const v1::ExecAdopt&, int) override {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      return absl::InternalError("socketpair");
    }
    std::lock_guard<std::mutex> lock(mu_);
    ours_.emplace_back(sv[1]);
    return UniqueFd(sv[0]);
  }
  // Re-points are recorded and acknowledged at once.
  absl::Status SendRepoint(const v1::ExecRepoint& repoint, int) override {
    std::lock_guard<std::mutex> lock(mu_);
    repoints_.push_back(repoint);
    return absl::OkStatus();
  }
  absl::Status AwaitRepointAck(const v1::ExecRepoint&, absl::Time) override {
    return absl::OkStatus();
  }
  void RequestStop() override { End(0); }
  void Abandon() override {}
  void Signal(int sig) override { End(sig); }
  int Reap() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return ended_; });
    return wait_status_;
  }
  pid_t pid() const override { return pid_; }
  const StatusPage& page() const override { return page_; }
  const v1::ExecInitReply& info() const override { return info_; }

  std::vector<v1::ExecRepoint> repoints() {
    std::lock_guard<std::mutex> lock(mu_);
    return repoints_;
  }
  // The process ends with wait status `ws` (the first end counts).
  void End(int ws) {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_) return;
    ended_ = true;
    wait_status_ = ws;
    cv_.notify_all();
  }

 private:
  const pid_t pid_;
  StatusPage page_;
  v1::ExecInitReply info_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool ended_ = false;
  int wait_status_ = 0;
  std::vector<UniqueFd> ours_;
  std::vector<v1::ExecRepoint> repoints_;
};

constexpr int kSegv = SIGSEGV;  // wait status: killed by SIGSEGV
constexpr int kExit1 = 1 << 8;  // wait status: exited with code 1

// Starts fakes and remembers them (the pool owns them).
struct Fakes {
  std::mutex mu;
  std::vector<FakeExecutor*> started;
  pid_t next_pid = 100001;

  ExecutorLauncher Launcher() {
    return [this](const std::string&, const v1::ExecInit& init, milliseconds)
               -> absl::StatusOr<std::unique_ptr<ExecutorProcess>> {
      absl::StatusOr<StatusPage> page = StatusPage::Create(init.slots());
      if (!page.ok()) return page.status();
      std::lock_guard<std::mutex> lock(mu);
      auto fake = std::make_unique<FakeExecutor>(next_pid++, *std::move(page),
                                                 init.uid());
      started.push_back(fake.get());
      return std::unique_ptr<ExecutorProcess>(std::move(fake));
    };
  }
  FakeExecutor* at(size_t i) {
    std::lock_guard<std::mutex> lock(mu);
    return i < started.size() ? started[i] : nullptr;
  }
};

PoolOptions Options(Fakes* fakes) {
  PoolOptions o;
  o.isolation = Isolation::kUid;
  o.binary = "kregd-exec (fake)";
  o.slots = 4;
  o.idle_ms = 600000;
  o.launcher = fakes->Launcher();
  return o;
}

EntryPtr Entry(const std::string& name) {
  auto e = std::make_shared<TargetEntry>();
  e->key = {name, Platform::kCpu};
  e->func_name = "Fn";
  e->content_id = "c";
  e->module_digest = "sha256:aa";
  return e;
}

PeerCred Peer(uid_t uid, pid_t pid) {
  PeerCred p;
  p.uid = uid;
  p.gid = uid;
  p.pid = pid;
  return p;
}

// A client socket for Bind (the fakes never read it).
struct Client {
  UniqueFd ours, theirs;
  Client() {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    ours.reset(sv[0]);
    theirs.reset(sv[1]);
  }
};

// A quarantine sink that blocks (like a journal write waiting on fsync)
// until released.
struct BlockingSink {
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false;
  bool released = false;

  CrashLedger::QuarantineSink fn() {
    return [this](const CrashRecord&, bool) {
      std::unique_lock<std::mutex> lock(mu);
      entered = true;
      cv.notify_all();
      cv.wait(lock, [&] { return released; });
    };
  }
  bool WaitEntered() {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(10), [&] { return entered; });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu);
    released = true;
    cv.notify_all();
  }
};

TEST_CASE(
    "A crash being journaled holds up no Bind, status or AwaitCrash "
    "of another session",
    "[executor_pool]") {
  CrashLedger ledger(CrashPolicy{1, 600});  // the first crash quarantines
  BlockingSink sink;
  ledger.SetSink(sink.fn());
  Fakes fakes;
  ExecutorPool pool(Options(&fakes), &ledger);
  Client ca, cb;

  absl::StatusOr<ExecutorPool::Binding> a =
      pool.Bind(1, ca.ours.get(), Peer(1000, 11));
  REQUIRE(a.ok());
  FakeExecutor* exec = fakes.at(0);
  REQUIRE(exec != nullptr);
  const uint32_t token = pool.TokenFor(*a, Entry("hostile.Segfault"));
  exec->page().slot(a->slot)->token.store(token);
  exec->page().header()->faulted_slot.store(a->slot + 1);
  exec->End(kSegv);
  REQUIRE(sink.WaitEntered());

  // The sink is blocked inside the crash's recording: the pool is not.
  auto bind = std::async(std::launch::async, [&] {
    return pool.Bind(2, cb.ours.get(), Peer(1001, 12));
  });
  const bool bound =
      bind.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  auto status = std::async(std::launch::async, [&] {
    pool.counters();
    return pool.List().size();
  });
  const bool answered =
      status.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  // AwaitCrash waits for the crash's text, which needs the ledger's answer.
  auto crash =
      std::async(std::launch::async, [&] { return pool.AwaitCrash(&*a); });
  const bool waited =
      crash.wait_for(milliseconds(300)) == std::future_status::timeout;
  sink.Release();
  CHECK(bound);
  CHECK(answered);
  CHECK(waited);
  absl::StatusOr<ExecutorPool::Binding> b = bind.get();
  CHECK(b.ok());
  CHECK(status.get() == 1);  // uid 1001's executor; uid 1000's is gone
  absl::Status st = crash.get();
  CHECK(st.code() == absl::StatusCode::kInternal);
  CHECK(st.message().find("target \"hostile.Segfault\"") !=
        absl::string_view::npos);
  CHECK(st.message().find("crashed its kregd executor") !=
        absl::string_view::npos);
  CHECK(st.message().find("now quarantined for uid 1000") !=
        absl::string_view::npos);
  CHECK(pool.counters().executor_crashes == 1);
  pool.Release(&*a);
  if (b.ok()) pool.Release(&*b);
}

TEST_CASE(
    "Only the faulting session is blamed; the other running call is "
    "interrupted",
    "[executor_pool]") {
  CrashLedger ledger(CrashPolicy{3, 600});
  Fakes fakes;
  ExecutorPool pool(Options(&fakes), &ledger);
  Client ca, cb;
  absl::StatusOr<ExecutorPool::Binding> nap =
      pool.Bind(1, ca.ours.get(), Peer(1000, 11));
  absl::StatusOr<ExecutorPool::Binding> segv =
      pool.Bind(2, cb.ours.get(), Peer(1000, 12));
  REQUIRE(nap.ok());
  REQUIRE(segv.ok());
  REQUIRE(nap->group == segv->group);  // isolation uid: one executor
  FakeExecutor* exec = fakes.at(0);
  exec->page().slot(nap->slot)->token.store(
      pool.TokenFor(*nap, Entry("hostile.Nap")));
  exec->page()
      .slot(segv->slot)
      ->token.store(pool.TokenFor(*segv, Entry("hostile.Segfault")));
  exec->page().header()->faulted_slot.store(segv->slot + 1);
  exec->End(kSegv);

  absl::Status interrupted = pool.AwaitCrash(&*nap);
  absl::Status crashed = pool.AwaitCrash(&*segv);
  CHECK(interrupted.code() == absl::StatusCode::kAborted);
  CHECK(interrupted.message().find("this call of target \"hostile.Nap\"") !=
        absl::string_view::npos);
  CHECK(interrupted.message().find("was interrupted") !=
        absl::string_view::npos);
  CHECK(crashed.code() == absl::StatusCode::kInternal);
  CHECK(ledger.Rows("hostile.Nap").empty());
  CHECK(ledger.Rows("hostile.Segfault").size() == 1);
  CHECK(pool.counters().executor_crashes == 1);
  pool.Release(&*nap);
  pool.Release(&*segv);
}

TEST_CASE(
    "An executor that dies with no call running fails only a pending "
    "request",
    "[executor_pool]") {
  CrashLedger ledger(CrashPolicy{3, 600});
  Fakes fakes;
  ExecutorPool pool(Options(&fakes), &ledger);
  Client c;
  absl::StatusOr<ExecutorPool::Binding> a =
      pool.Bind(1, c.ours.get(), Peer(1000, 11));
  REQUIRE(a.ok());
  fakes.at(0)->End(kExit1);
  CHECK(pool.AwaitCrash(&*a).ok());  // idle: the client reconnects quietly
  absl::Status pending = pool.AwaitCrash(&*a, /*request_pending=*/true);
  CHECK(pending.code() == absl::StatusCode::kInternal);
  CHECK(pending.message().find("exited with code 1") !=
        absl::string_view::npos);
  CHECK(pending.message().find("before it read this session's request") !=
        absl::string_view::npos);
  CHECK(pool.counters().executor_crashes == 1);
  pool.Release(&*a);
}

// `e` at `generation` (what Registry::Replace, or a pinned resolve, makes
// of it: another entry, same registration).
EntryPtr AtGeneration(const EntryPtr& e, uint32_t generation) {
  auto g = std::make_shared<TargetEntry>(*e);
  g->generation = generation;
  return g;
}

// Counts `n` calls in `token`'s row of `exec`'s page.
void Called(FakeExecutor* exec, uint32_t token, int n) {
  for (int i = 0; i < n; ++i) {
    RecordLaunch(exec->page().stats_row(token), 1000, true);
  }
}

// Launches per (registered at, generation) of the snapshot's rows of `name`.
std::map<std::pair<int64_t, uint32_t>, uint64_t> LaunchesOf(
    const ExecutorPool& pool, const std::string& name) {
  std::map<std::pair<int64_t, uint32_t>, uint64_t> out;
  for (const TargetStatsRow& r : pool.TargetStatsSnapshot()) {
    if (r.entry->key.name != name) continue;
    out[{r.entry->registered_at_us, r.entry->generation}] += r.stats.launches;
  }
  return out;
}

TEST_CASE(
    "Each generation has its own token and row in an executor; a re-point "
    "carries the new one, a pinned resolve shares its generation's",
    "[executor_pool][repoint]") {
  CrashLedger ledger(CrashPolicy{3, 600});
  Fakes fakes;
  ExecutorPool pool(Options(&fakes), &ledger);
  Client ca, cb;
  absl::StatusOr<ExecutorPool::Binding> a =
      pool.Bind(1, ca.ours.get(), Peer(1000, 11));
  absl::StatusOr<ExecutorPool::Binding> b =
      pool.Bind(2, cb.ours.get(), Peer(1001, 12));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(a->group != b->group);  // isolation uid: two executors
  FakeExecutor* exec_a = fakes.at(0);
  FakeExecutor* exec_b = fakes.at(1);
  auto first = std::make_shared<TargetEntry>(*Entry("op"));
  first->registered_at_us = 5;
  const EntryPtr gen1 = first;
  const EntryPtr gen2 = AtGeneration(gen1, 2);

  CHECK(pool.TokenFor(*a, gen1) == 1);
  // A pinned resolve of generation 1 is another entry of that generation.
  CHECK(pool.TokenFor(*a, AtGeneration(gen1, 1)) == 1);
  v1::ExecRepoint repoint;
  repoint.set_target_name("op");
  repoint.set_platform("cpu");
  repoint.set_generation(2);
  std::map<uint64_t, absl::Status> acks =
      pool.Repoint({1}, repoint, gen2, ca.theirs.get(), absl::Now());
  REQUIRE(acks.size() == 1);
  CHECK(acks[1].ok());
  REQUIRE(exec_a->repoints().size() == 1);
  CHECK(exec_a->repoints()[0].token() == 2);  // generation 2's own row
  CHECK(exec_b->repoints().empty());          // it serves no holder
  // A resolve of generation 2 in that executor gets the token the re-point
  // gave it; the other executor numbers its own.
  CHECK(pool.TokenFor(*a, gen2) == 2);
  CHECK(pool.TokenFor(*b, AtGeneration(gen1, 1)) == 1);
  CHECK(pool.TokenFor(*b, gen2) == 2);
  // The name retired and registered again: another registration.
  auto again = std::make_shared<TargetEntry>(*gen1);
  again->registered_at_us = 9;
  CHECK(pool.TokenFor(*a, again) == 3);

  Called(exec_a, 1, 3);  // generation 1, unpinned and pinned
  Called(exec_a, 2, 5);  // generation 2 after the switch
  Called(exec_a, 3, 1);
  Called(exec_b, 1, 2);  // a pinned session of uid 1001
  using Counts = std::map<std::pair<int64_t, uint32_t>, uint64_t>;
  const Counts want{{{5, 1}, 5}, {{5, 2}, 5}, {{9, 1}, 1}};
  CHECK(LaunchesOf(pool, "op") == want);
  // A reaped executor's rows keep counting under their generations.
  exec_a->End(kExit1);
  CHECK(pool.AwaitCrash(&*a).ok());
  CHECK(LaunchesOf(pool, "op") == want);
  pool.Release(&*a);
  pool.Release(&*b);
}

// An executor an earlier kregd left running, as ExecutorPool::Readopt
// takes it (DESIGN §12).
std::unique_ptr<FakeExecutor> Orphan(pid_t pid, uid_t uid) {
  absl::StatusOr<StatusPage> page = StatusPage::Create(4);
  REQUIRE(page.ok());
  return std::make_unique<FakeExecutor>(pid, *std::move(page), uid);
}

ReadoptedSession Offered(uint32_t slot, const PeerCred& peer,
                         std::vector<std::pair<EntryPtr, uint32_t>> tokens) {
  ReadoptedSession s;
  s.session_id = 50 + slot;
  s.slot = slot;
  s.peer = peer;
  s.tokens = std::move(tokens);
  return s;
}

TEST_CASE("A re-adopted executor is supervised like one the pool started",
          "[executor_pool][readopt]") {
  CrashLedger ledger(CrashPolicy{3, 600});
  Fakes fakes;
  ExecutorPool pool(Options(&fakes), &ledger);
  std::unique_ptr<FakeExecutor> orphan = Orphan(4242, 1000);
  FakeExecutor* exec = orphan.get();
  const EntryPtr scale = Entry("t.scale");
  const EntryPtr crashy = Entry("hostile.Segfault");
  int confirmed = 0;
  absl::StatusOr<std::vector<ExecutorPool::Binding>> bound = pool.Readopt(
      std::move(orphan), "uid 1000",
      {Offered(2, Peer(1000, 77), {{scale, 1}, {nullptr, 2}, {crashy, 3}})},
      [&] { return ++confirmed == 1; });
  REQUIRE(bound.ok());
  CHECK(confirmed == 1);
  REQUIRE(bound->size() == 1);
  ExecutorPool::Binding& b = (*bound)[0];
  CHECK(b.slot == 2);
  // Listed, with its session; new sessions of its group go to it.
  REQUIRE(pool.List().size() == 1);
  CHECK(pool.List()[0].pid == 4242);
  CHECK(pool.List()[0].sessions == 1);
  CHECK(pool.Sessions()[0].session_id == 52);
  Client c;
  absl::StatusOr<ExecutorPool::Binding> more =
      pool.Bind(9, c.ours.get(), Peer(1000, 78));
  REQUIRE(more.ok());
  CHECK(more->group == b.group);
  CHECK(fakes.at(0) == nullptr);  // nothing started
  // The earlier kregd's tokens still name its targets: a resolve of the
  // same entry gets the same token, its statistics row.
  CHECK(pool.TokenFor(b, scale) == 1);
  // A crash on it is blamed on the target its page names and counted.
  exec->page().slot(2)->token.store(3);
  exec->page().header()->faulted_slot.store(3);
  exec->End(kSegv);
  absl::Status st = pool.AwaitCrash(&b);
  CHECK(st.code() == absl::StatusCode::kInternal);
  CHECK(st.message().find("target \"hostile.Segfault\"") !=
        absl::string_view::npos);
  CHECK(pool.counters().executor_crashes == 1);
  pool.Release(&b);
  pool.Release(&*more);
}

TEST_CASE("A token whose target is not registered any more is not blamed",
          "[executor_pool][readopt]") {
  CrashLedger ledger(CrashPolicy{3, 600});
  Fakes fakes;
  ExecutorPool pool(Options(&fakes), &ledger);
  std::unique_ptr<FakeExecutor> orphan = Orphan(4243, 1000);
  FakeExecutor* exec = orphan.get();
  absl::StatusOr<std::vector<ExecutorPool::Binding>> bound = pool.Readopt(
      std::move(orphan), "uid 1000",
      {Offered(0, Peer(1000, 77), {{nullptr, 1}})}, [] { return true; });
  REQUIRE(bound.ok());
  exec->page().slot(0)->token.store(1);
  exec->page().header()->faulted_slot.store(1);
  exec->End(kSegv);
  absl::Status st = pool.AwaitCrash(&(*bound)[0]);
  CHECK(st.ok());  // nothing to name: an idle death, not a crash of a target
  CHECK(ledger.Rows().empty());
  pool.Release(&(*bound)[0]);
}

TEST_CASE("An executor of a group this kregd serves already keeps its own",
          "[executor_pool][readopt]") {
  CrashLedger ledger(CrashPolicy{3, 600});
  Fakes fakes;
  ExecutorPool pool(Options(&fakes), &ledger);
  Client c;
  absl::StatusOr<ExecutorPool::Binding> fresh =
      pool.Bind(1, c.ours.get(), Peer(1000, 11));
  REQUIRE(fresh.ok());
  absl::StatusOr<std::vector<ExecutorPool::Binding>> bound =
      pool.Readopt(Orphan(4244, 1000), "uid 1000",
                   {Offered(1, Peer(1000, 77), {})}, [] { return true; });
  REQUIRE(bound.ok());
  CHECK(pool.List().size() == 2);
  // New sessions still go to the executor this kregd started.
  Client d;
  absl::StatusOr<ExecutorPool::Binding> next =
      pool.Bind(2, d.ours.get(), Peer(1000, 12));
  REQUIRE(next.ok());
  CHECK(next->group == fresh->group);
  pool.Release(&*fresh);
  pool.Release(&*next);
  pool.Release(&(*bound)[0]);
}

TEST_CASE("Offers the pool cannot take are refused, naming why",
          "[executor_pool][readopt]") {
  CrashLedger ledger(CrashPolicy{3, 600});
  Fakes fakes;
  ExecutorPool pool(Options(&fakes), &ledger);
  auto ok = [] { return true; };
  SECTION("a session of another group under this isolation") {
    absl::StatusOr<std::vector<ExecutorPool::Binding>> r = pool.Readopt(
        Orphan(1, 1000), "uid 1000", {Offered(0, Peer(1001, 7), {})}, ok);
    CHECK(r.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(r.status().message().find("belongs to \"uid 1001\"") !=
          absl::string_view::npos);
  }
  SECTION("two sessions in one slot") {
    absl::StatusOr<std::vector<ExecutorPool::Binding>> r = pool.Readopt(
        Orphan(1, 1000), "uid 1000",
        {Offered(0, Peer(1000, 7), {}), Offered(0, Peer(1000, 8), {})}, ok);
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  }
  SECTION("a slot past the page") {
    absl::StatusOr<std::vector<ExecutorPool::Binding>> r = pool.Readopt(
        Orphan(1, 1000), "uid 1000", {Offered(4, Peer(1000, 7), {})}, ok);
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  }
  SECTION("a pid it supervises already") {
    REQUIRE(pool.Readopt(Orphan(5, 1000), "uid 1000", {}, ok).ok());
    absl::StatusOr<std::vector<ExecutorPool::Binding>> r =
        pool.Readopt(Orphan(5, 1000), "uid 1000", {}, ok);
    CHECK(r.status().code() == absl::StatusCode::kAlreadyExists);
  }
  SECTION("an executor that went away before it was told") {
    absl::StatusOr<std::vector<ExecutorPool::Binding>> r =
        pool.Readopt(Orphan(6, 1000), "uid 1000", {}, [] { return false; });
    CHECK(r.status().code() == absl::StatusCode::kUnavailable);
    CHECK(pool.List().empty());
  }
}

}  // namespace
}  // namespace kreg
