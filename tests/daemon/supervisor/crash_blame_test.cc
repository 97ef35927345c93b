// Blame when an executor dies: the decision over the status page's tokens,
// running flags, faulted_slot and GPU fault, and the errors sessions get.
#include "daemon/supervisor/crash_blame.h"

#include <regex>
#include <string>
#include <vector>

#include "catch2/catch.hpp"

namespace kreg {
namespace {

BlameSlot Running(uint32_t token) { return BlameSlot{true, token, 0}; }
BlameSlot Idle(uint32_t gpu_token = 0) { return BlameSlot{true, 0, gpu_token}; }

BlameInput Input(std::vector<BlameSlot> slots, uint32_t resolved = 2) {
  BlameInput in;
  in.slots = std::move(slots);
  in.resolved = resolved;
  return in;
}

TargetEntry Entry(const std::string& name) {
  TargetEntry e;
  e.key = {name, Platform::kCpu};
  e.func_name = "Fn";
  e.content_id = "c1";
  e.module_digest = "sha256:aa";
  return e;
}

TEST_CASE("A lone running handler is blamed and counted", "[crash_blame]") {
  CrashBlame b = DecideBlame(Input({Idle(), Running(1)}));
  REQUIRE(b.slots.size() == 1);
  CHECK(b.slots[0].slot == 1);
  CHECK(b.slots[0].token == 1);
  CHECK(b.slots[0].verdict == Verdict::kCrashed);
  CHECK(b.slots[0].counted);
  CHECK(b.culprit == -1);
}

TEST_CASE("Without a faulted slot every running handler is blamed",
          "[crash_blame]") {
  CrashBlame b = DecideBlame(Input({Running(1), Running(2)}));
  REQUIRE(b.slots.size() == 2);
  for (const SlotBlame& s : b.slots) {
    CHECK(s.verdict == Verdict::kCrashed);
    CHECK(s.counted);
  }
}

TEST_CASE(
    "The faulted slot alone is blamed; other running calls are "
    "interrupted and not counted",
    "[crash_blame]") {
  BlameInput in = Input({Running(1), Idle(), Running(2)});
  in.faulted_slot = 3;  // 1 + slot 2
  CrashBlame b = DecideBlame(in);
  CHECK(b.culprit == 2);
  REQUIRE(b.slots.size() == 2);
  CHECK(b.slots[0].slot == 0);
  CHECK(b.slots[0].verdict == Verdict::kInterrupted);
  CHECK_FALSE(b.slots[0].counted);
  CHECK(b.slots[1].slot == 2);
  CHECK(b.slots[1].verdict == Verdict::kCrashed);
  CHECK(b.slots[1].counted);
}

TEST_CASE("A faulted slot that was not running a known target is ignored",
          "[crash_blame]") {
  for (uint32_t faulted : {2u /* idle */, 4u /* unused */, 9u /* range */}) {
    BlameInput in = Input({Running(1), Idle(), Running(7), BlameSlot{}});
    in.faulted_slot = faulted;
    CrashBlame b = DecideBlame(in);
    CHECK(b.culprit == -1);
    REQUIRE(b.slots.size() == 1);  // token 7 > resolved: not blamed
    CHECK(b.slots[0].verdict == Verdict::kCrashed);
  }
  BlameInput unknown = Input({Running(1), Running(7)});
  unknown.faulted_slot = 2;  // running, but an unknown token
  CHECK(DecideBlame(unknown).culprit == -1);
}

TEST_CASE("Tokens kregd never handed out and unused slots blame nobody",
          "[crash_blame]") {
  BlameInput in = Input({Running(3), BlameSlot{false, 1, 1}}, 2);
  in.gpu_fault = true;
  CrashBlame b = DecideBlame(in);
  CHECK(b.slots.empty());
}

TEST_CASE(
    "A GPU fault after the handlers returned blames the one session "
    "with GPU work",
    "[crash_blame]") {
  BlameInput in = Input({Idle(2), Idle()});
  in.gpu_fault = true;
  CrashBlame b = DecideBlame(in);
  CHECK(b.gpu_only == 1);
  REQUIRE(b.slots.size() == 1);
  CHECK(b.slots[0].token == 2);
  CHECK(b.slots[0].verdict == Verdict::kLostGpuWork);
  CHECK(b.slots[0].counted);
}

TEST_CASE("A GPU fault with several sessions' GPU work counts against none",
          "[crash_blame]") {
  BlameInput in = Input({Idle(1), Idle(2)});
  in.gpu_fault = true;
  CrashBlame b = DecideBlame(in);
  CHECK(b.gpu_only == 2);
  REQUIRE(b.slots.size() == 2);
  for (const SlotBlame& s : b.slots) {
    CHECK(s.verdict == Verdict::kLostGpuWork);
    CHECK_FALSE(s.counted);
  }
}

TEST_CASE("GPU tokens count only when the executor found a GPU fault",
          "[crash_blame]") {
  CHECK(DecideBlame(Input({Idle(1)})).slots.empty());
}

TEST_CASE("A running handler is counted even when GPU work is ambiguous",
          "[crash_blame]") {
  BlameInput in = Input({Running(1), Idle(2), Idle(2)});
  in.gpu_fault = true;
  CrashBlame b = DecideBlame(in);
  REQUIRE(b.slots.size() == 3);
  CHECK(b.slots[0].counted);
  CHECK_FALSE(b.slots[1].counted);
  CHECK_FALSE(b.slots[2].counted);
}

TEST_CASE("Nothing counts while kregd was stopping the executor",
          "[crash_blame]") {
  BlameInput in = Input({Running(1)});
  in.stop_requested = true;
  CrashBlame b = DecideBlame(in);
  REQUIRE(b.slots.size() == 1);
  CHECK(b.slots[0].verdict == Verdict::kCrashed);
  CHECK_FALSE(b.slots[0].counted);
}

TEST_CASE("An interrupted call gets ABORTED naming the crashing target",
          "[crash_blame]") {
  TargetEntry nap = Entry("hostile.Nap");
  TargetEntry segv = Entry("hostile.Segfault");
  SlotBlame s{0, 1, Verdict::kInterrupted, false};
  absl::Status st = CrashError(s, nap, &segv, {42, "uid 1000"},
                               "it was killed by signal 11", 0, "");
  CHECK(st.code() == absl::StatusCode::kAborted);
  // What tests/python/test_executors.py finds in kregd's log.
  CHECK(std::regex_search(
      std::string(st.message()),
      std::regex(R"(this call of target "hostile.Nap" .* was interrupted: )"
                 R"(its kregd executor \(pid \d+, uid \d+\) ended while )"
                 R"(it ran because the call of target "hostile.Segfault")")));
  CHECK(st.message().find("not counted against \"hostile.Nap\"") !=
        absl::string_view::npos);
}

TEST_CASE("A crashed call gets INTERNAL with its quarantine note",
          "[crash_blame]") {
  TargetEntry segv = Entry("hostile.Segfault");
  SlotBlame s{0, 1, Verdict::kCrashed, true};
  absl::Status st =
      CrashError(s, segv, nullptr, {42, "shared"}, "it exited with code 3", 0,
                 " (crash 1 of 3 within 600 s before the target is "
                 "quarantined)");
  CHECK(st.code() == absl::StatusCode::kInternal);
  CHECK(std::string(st.message()) ==
        "target \"hostile.Segfault\" (cpu, content c1, function Fn, module "
        "sha256:aa) crashed its kregd executor (pid 42, shared): it exited "
        "with code 3. kregd and other clients are unaffected; the next call "
        "starts a fresh executor. (crash 1 of 3 within 600 s before the "
        "target is quarantined)");
}

TEST_CASE("Lost GPU work says when the faulting kernel is not known",
          "[crash_blame]") {
  TargetEntry e = Entry("k");
  SlotBlame s{0, 1, Verdict::kLostGpuWork, false};
  absl::Status one = CrashError(s, e, nullptr, {1, "g"}, "how", 1, "");
  absl::Status two = CrashError(s, e, nullptr, {1, "g"}, "how", 2, "");
  CHECK(one.code() == absl::StatusCode::kInternal);
  CHECK(one.message().find("was lost") != absl::string_view::npos);
  CHECK(one.message().find("not known") == absl::string_view::npos);
  CHECK(two.message().find("2 sessions of that executor had GPU work, so "
                           "which kernel faulted is not known") !=
        absl::string_view::npos);
}

TEST_CASE("How an executor ended: kregd's reason, an outside SIGKILL, a stop",
          "[crash_blame]") {
  ExecutorEnd end;
  end.wait_text = "was killed by signal 11 (SIGSEGV, Segmentation fault)";
  CHECK(DescribeEnd(end) ==
        "it was killed by signal 11 (SIGSEGV, Segmentation fault)");
  end.note = "boom";
  CHECK(DescribeEnd(end) ==
        "it was killed by signal 11 (SIGSEGV, Segmentation fault) (boom)");
  end.note.clear();
  end.sigkill = true;
  CHECK(DescribeEnd(end).find("from outside kregd") != std::string::npos);
  end.killed_because = "the call ran longer than launch_timeout";
  CHECK(DescribeEnd(end) == end.killed_because);
  end.killed_because.clear();
  end.stop_requested = true;
  CHECK(DescribeEnd(end) == "it was stopped because kregd is stopping it");
}

TEST_CASE("The quarantine note follows the ledger's row and policy",
          "[crash_blame]") {
  CrashRecord rec;
  rec.key = {"t", Platform::kCpu};
  rec.uid = 1000;
  rec.crashes_in_window = 3;
  rec.quarantined = true;
  CHECK(QuarantineNote(rec, CrashPolicy{3, 600}) ==
        " The target is now quarantined for uid 1000 after 3 crashes within "
        "600 s: its calls fail at once until `kregctl unquarantine t "
        "--platform cpu`.");
  rec.quarantined = false;
  rec.crashes_in_window = 1;
  CHECK(QuarantineNote(rec, CrashPolicy{3, 600}) ==
        " (crash 1 of 3 within 600 s before the target is quarantined)");
  CHECK(QuarantineNote(rec, CrashPolicy{0, 600}).empty());
}

}  // namespace
}  // namespace kreg
