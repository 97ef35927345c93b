// kregd's side of re-pointing (docs/replace.md sections 3-5): what
// Executor::AwaitRepointAck believes of the executor's control socket (the
// executor runs untrusted kernels), RepointFanout's merge, and what
// SessionBindings records per holder.
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "catch2/catch.hpp"
#include "common/wire.h"
#include "daemon/supervisor/executor.h"
#include "daemon/supervisor/repoint_fanout.h"
#include "daemon/supervisor/session_bindings.h"

namespace kreg {
namespace {

// An Executor over one end of a socketpair; the test plays the executor on
// the other. Its pid is the test's own (Abandon()ed, so nothing waits on
// or signals it).
struct Harness {
  std::unique_ptr<Executor> exec;
  UniqueFd peer;

  Harness() {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    peer = UniqueFd(sv[1]);
    absl::StatusOr<StatusPage> page = StatusPage::Create(1);
    REQUIRE(page.ok());
    absl::StatusOr<std::unique_ptr<Executor>> e = Executor::Readopt(
        ::getpid(), UniqueFd(sv[0]), *std::move(page), v1::ExecInitReply());
    REQUIRE(e.ok());
    exec = *std::move(e);
  }
  ~Harness() { exec->Abandon(); }

  void Send(const std::string& bytes) {
    REQUIRE(wire::SendFrame(peer.get(), bytes.data(), bytes.size(), nullptr,
                            0) == wire::kOk);
  }
  void Ack(uint32_t generation, int code = 0, const std::string& msg = "",
           const std::string& name = "op") {
    v1::ExecRepointAck ack;
    ack.set_target_name(name);
    ack.set_platform("cpu");
    ack.set_generation(generation);
    ack.mutable_status()->set_code(code);
    ack.mutable_status()->set_message(msg);
    Send(ack.SerializeAsString());
  }
};

v1::ExecRepoint Repoint(uint32_t generation, const std::string& name = "op") {
  v1::ExecRepoint r;
  r.set_target_name(name);
  r.set_platform("cpu");
  r.set_generation(generation);
  return r;
}

absl::Time Soon() { return absl::Now() + absl::Seconds(30); }

TEST_CASE("AwaitRepointAck takes the executor's answer for its generation",
          "[repoint]") {
  Harness h;
  // A late ack of an earlier generation and another target's come first.
  h.Ack(1);
  h.Ack(5, 0, "", "other");
  h.Ack(2);
  CHECK(h.exec->AwaitRepointAck(Repoint(2), Soon()).ok());
  // The other target's ack was kept for its own waiter.
  CHECK(h.exec->AwaitRepointAck(Repoint(5, "other"), absl::Now()).ok());
  // An error answer is returned as the executor said it.
  h.Ack(3, static_cast<int>(absl::StatusCode::kNotFound), "no symbol");
  absl::Status s = h.exec->AwaitRepointAck(Repoint(3), Soon());
  CHECK(s.code() == absl::StatusCode::kNotFound);
  CHECK(s.message() == "no symbol");
}

TEST_CASE("AwaitRepointAck without an answer ends at the deadline",
          "[repoint]") {
  Harness h;
  absl::Status s = h.exec->AwaitRepointAck(
      Repoint(2), absl::Now() + absl::Milliseconds(100));
  CHECK(s.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(s.message() == "no acknowledgement in time");
}

TEST_CASE("a frame on the control socket that is no ack breaks it",
          "[repoint]") {
  SECTION("over the size limit: refused unread") {
    Harness h;
    std::string big(kMaxRepointAckBytes + 1, 'x');
    h.Send(big);
    absl::Status s = h.exec->AwaitRepointAck(Repoint(2), Soon());
    CHECK(s.code() == absl::StatusCode::kUnavailable);
    CHECK(s.message() == "executor pid " + std::to_string(::getpid()) +
                             " sent an unreadable frame on its control "
                             "socket");
    // kregd closed its end (unread bytes make it a reset).
    char c;
    CHECK(::read(h.peer.get(), &c, 1) <= 0);  // EOF, or a reset
  }
  SECTION("not a message") {
    Harness h;
    h.Send("\xff\xff\xff");
    CHECK(h.exec->AwaitRepointAck(Repoint(2), Soon()).code() ==
          absl::StatusCode::kUnavailable);
  }
  SECTION("the executor closed the socket") {
    Harness h;
    h.peer.reset();
    CHECK(h.exec->AwaitRepointAck(Repoint(2), Soon()).code() ==
          absl::StatusCode::kUnavailable);
  }
}

struct FixedRepointer : Repointer {
  std::vector<Laggard> laggards;
  std::vector<Laggard> Repoint(const TargetEntry&, absl::Time) override {
    return laggards;
  }
};

TEST_CASE("RepointFanout merges its parts' laggards by pid", "[repoint]") {
  FixedRepointer isolated, local;
  isolated.laggards = {{PeerCred{1000, 1000, 30}, false, 1, ""}};
  local.laggards = {{PeerCred{1000, 1000, 20}, true, 1, ""},
                    {PeerCred{1000, 1000, 40}, true, 1, ""}};
  RepointFanout fanout;
  CHECK(fanout.Repoint(TargetEntry(), Soon()).empty());
  fanout.Add(&isolated);
  fanout.Add(&local);
  std::vector<Repointer::Laggard> all = fanout.Repoint(TargetEntry(), Soon());
  REQUIRE(all.size() == 3);
  CHECK(all[0].peer.pid == 20);
  CHECK(all[0].local);
  CHECK(all[1].peer.pid == 30);
  CHECK_FALSE(all[1].local);
  CHECK(all[2].peer.pid == 40);
}

TEST_CASE("SessionBindings records the generation each holder runs",
          "[repoint]") {
  SessionBindings b;
  const TargetKey op{"op", Platform::kCpu};
  b.Add(1, PeerCred{1000, 1000, 11}, op, /*local=*/false, 1);
  b.Add(2, PeerCred{1000, 1000, 12}, op, /*local=*/true, 1);
  b.Add(3, PeerCred{1000, 1000, 13}, {"other", Platform::kCpu});
  auto holders = b.HoldersOf(op);
  REQUIRE(holders.size() == 2);
  CHECK(holders[1].first.pid == 11);
  CHECK(holders[2].second.local);
  b.SetGeneration(1, op, 2);
  b.SetGeneration(9, op, 2);  // a session that ended: nothing
  // A later Add without a generation keeps the one recorded.
  b.Add(1, PeerCred{1000, 1000, 11}, op);
  holders = b.HoldersOf(op);
  CHECK(holders[1].second.generation == 2);
  CHECK(holders[2].second.generation == 1);
  auto snapshot = b.Snapshot();
  REQUIRE(snapshot[1].size() == 1);
  CHECK(snapshot[1][0].generation == 2);
}

TEST_CASE("SessionBindings tells the registry which generations are held",
          "[repoint][generations]") {
  SessionBindings b;
  const TargetKey op{"op", Platform::kCpu};
  b.Add(5, PeerCred{1000, 1000, 25}, op, /*local=*/false, 3);
  b.Add(4, PeerCred{1001, 1001, 24}, op, /*local=*/true, 1, /*pinned=*/true);
  b.Add(6, PeerCred{1000, 1000, 26}, {"other", Platform::kCpu}, false, 7);
  std::vector<BindingOracle::GenerationHold> holds = b.GenerationHolds(op);
  REQUIRE(holds.size() == 2);  // by pid
  CHECK(holds[0].peer.pid == 24);
  CHECK(holds[0].generation == 1);
  CHECK(holds[0].pinned);
  CHECK(holds[1].peer.pid == 25);
  CHECK(holds[1].generation == 3);
  CHECK_FALSE(holds[1].pinned);
  b.RemoveSession(4);  // the process exited: its pin goes
  holds = b.GenerationHolds(op);
  REQUIRE(holds.size() == 1);
  CHECK(holds[0].peer.pid == 25);
}

// An entry at generation 3 whose generations were made by `by` (uids,
// generation 1 first).
TargetEntry MadeBy(std::vector<uid_t> by) {
  TargetEntry e;
  e.key = {"op", Platform::kCpu};
  for (size_t i = 0; i < by.size(); ++i) {
    Generation g;
    g.generation = static_cast<uint32_t>(i + 1);
    g.by.uid = by[i];
    e.generations.push_back(g);
  }
  e.generation = static_cast<uint32_t>(by.size());
  return e;
}

TEST_CASE(
    "A holder of content follows only its own uid's and root's generations; "
    "one bound by name follows all, a pin none",
    "[repoint][trust]") {
  SessionBindings::Bound by_name;
  SessionBindings::Bound registered;
  registered.registered = 1;
  SessionBindings::Bound pinned;
  pinned.pinned = true;
  pinned.generation = 2;
  // Owner 1000 made generation 1, then 2 and 3.
  const TargetEntry owners = MadeBy({1000, 1000, 1000});
  CHECK(FollowedGeneration(owners, by_name, 1001) == 3);
  CHECK(FollowedGeneration(owners, registered, 1001) == 1);  // another uid
  CHECK(FollowedGeneration(owners, registered, 1000) == 3);  // its own uid
  CHECK(FollowedGeneration(owners, pinned, 1000) == 2);
  // Root's replacement reaches every content holder; the owner's after it
  // does not reach another uid's.
  CHECK(FollowedGeneration(MadeBy({1000, 0, 1000}), registered, 1001) == 2);
  CHECK(FollowedGeneration(MadeBy({1000, 0, 0}), registered, 1001) == 3);
  // Registered at generation 2: what came before does not matter.
  registered.registered = 2;
  CHECK(FollowedGeneration(MadeBy({1000, 1000, 1001}), registered, 1001) == 3);
  CHECK(FollowedGeneration(MadeBy({1000, 1000, 1000}), registered, 1001) == 2);
  // Never replaced: the one generation.
  TargetEntry once;
  once.generation = 1;
  registered.registered = 1;
  CHECK(FollowedGeneration(once, registered, 1001) == 1);
}

TEST_CASE("SessionBindings knows what a process registered, by pid",
          "[repoint][trust]") {
  // Process start times (0: no such process); pid 11 is alive.
  std::map<pid_t, uint64_t> started = {{11, 500}, {12, 600}};
  SessionBindings b([&](pid_t pid) { return started[pid]; });
  const TargetKey op{"op", Platform::kCpu};
  // A control connection of pid 11 registered op at generation 2; its
  // session bound it without registering.
  b.Add(1, PeerCred{1000, 1000, 11}, op, /*local=*/false, 2, false,
        /*registered=*/2);
  b.RecordRegistration(PeerCred{1000, 1000, 11}, op, 2);
  b.Add(2, PeerCred{1000, 1000, 11}, op, /*local=*/true, 2);
  b.Add(3, PeerCred{1000, 1000, 12}, op, /*local=*/false, 2);
  CHECK(b.RegisteredBy(11, op) == 2);
  CHECK(b.RegisteredBy(12, op) == 0);  // bound by name only
  CHECK(b.RegisteredBy(11, {"other", Platform::kCpu}) == 0);
  CHECK(b.HoldersOf(op)[1].second.registered == 2);
  CHECK(b.HoldersOf(op)[2].second.registered == 0);
  // Its connections closed: the process still holds that content.
  b.RemoveSession(1);
  b.RemoveSession(2);
  CHECK(b.RegisteredBy(11, op) == 2);
  // Its next registration (its own replacement) is what it holds.
  b.RecordRegistration(PeerCred{1000, 1000, 11}, op, 3);
  CHECK(b.RegisteredBy(11, op) == 3);
  // A later process with the same pid registered nothing.
  started[11] = 900;
  CHECK(b.RegisteredBy(11, op) == 0);
  // Nor does one that had ended when its registration was answered.
  b.RecordRegistration(PeerCred{1000, 1000, 13}, op, 1);
  CHECK(b.RegisteredBy(13, op) == 0);
}

}  // namespace
}  // namespace kreg
