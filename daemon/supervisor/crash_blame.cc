#include "daemon/supervisor/crash_blame.h"

#include "absl/strings/str_cat.h"

namespace kreg {

CrashBlame DecideBlame(const BlameInput& in) {
  const size_t n = in.slots.size();
  std::vector<uint32_t> blamed(n, 0);
  std::vector<bool> running(n, false);
  CrashBlame out;
  for (size_t i = 0; i < n; ++i) {
    const BlameSlot& s = in.slots[i];
    if (!s.used) continue;
    uint32_t token = s.token;
    running[i] = token != 0;
    if (token == 0 && in.gpu_fault) {
      token = s.gpu_token;
      if (token != 0) ++out.gpu_only;
    }
    if (token != 0 && token <= in.resolved) blamed[i] = token;
  }
  // Only a slot that was running a known target can be the culprit.
  const uint32_t f = in.faulted_slot;
  if (f >= 1 && f <= n && in.slots[f - 1].used && running[f - 1] &&
      blamed[f - 1] != 0) {
    out.culprit = static_cast<int64_t>(f) - 1;
  }
  for (size_t i = 0; i < n; ++i) {
    if (!in.slots[i].used || blamed[i] == 0) continue;
    SlotBlame b;
    b.slot = static_cast<uint32_t>(i);
    b.token = blamed[i];
    if (out.culprit >= 0 && static_cast<int64_t>(i) != out.culprit) {
      b.verdict = Verdict::kInterrupted;
    } else {
      b.verdict = running[i] ? Verdict::kCrashed : Verdict::kLostGpuWork;
      b.counted = !in.stop_requested && (running[i] || out.gpu_only == 1);
    }
    out.slots.push_back(b);
  }
  return out;
}

std::string DescribeEnd(const ExecutorEnd& end) {
  std::string how = end.killed_because.empty()
                        ? absl::StrCat("it ", end.wait_text)
                        : end.killed_because;
  if (end.killed_because.empty() && end.sigkill) {
    // kregd records and logs every kill it makes ("killing executor ..."):
    // this one came from elsewhere.
    how =
        "it was killed by signal 9 (SIGKILL) from outside kregd (kregd logs "
        "every kill it makes): the kernel's OOM killer, a cgroup limit or an "
        "operator";
  }
  if (end.stop_requested && end.killed_because.empty()) {
    how = "it was stopped because kregd is stopping it";
  }
  if (!end.note.empty()) absl::StrAppend(&how, " (", end.note, ")");
  return how;
}

std::string DescribeTarget(const TargetEntry& e) {
  return absl::StrCat("target \"", e.key.name, "\" (",
                      PlatformName(e.key.platform), ", content ", e.content_id,
                      ", function ", e.func_name, ", module ", e.module_digest,
                      ")");
}

std::string QuarantineNote(const CrashRecord& rec, const CrashPolicy& p) {
  if (rec.quarantined) {
    return absl::StrCat(
        " The target is now quarantined for uid ", rec.uid, " after ",
        rec.crashes_in_window, " crashes within ", p.window_s,
        " s: its calls fail at once until `kregctl unquarantine ", rec.key.name,
        " --platform ", PlatformName(rec.key.platform), "`.");
  }
  if (p.max_crashes > 0) {
    return absl::StrCat(" (crash ", rec.crashes_in_window, " of ",
                        p.max_crashes, " within ", p.window_s,
                        " s before the target is quarantined)");
  }
  return "";
}

absl::Status CrashError(const SlotBlame& slot, const TargetEntry& target,
                        const TargetEntry* culprit, const ExecutorName& exec,
                        const std::string& how, int gpu_only,
                        const std::string& quarantine) {
  const std::string name = DescribeTarget(target);
  switch (slot.verdict) {
    case Verdict::kInterrupted:
      return absl::AbortedError(absl::StrCat(
          "this call of ", name, " was interrupted: its kregd executor (pid ",
          exec.pid, ", ", exec.group,
          ") ended while it ran because the call of ",
          culprit != nullptr ? DescribeTarget(*culprit) : "another target",
          " in another session crashed it: ", how,
          ". Its outputs were not returned and the crash is not counted "
          "against \"",
          target.key.name, "\"; the next call starts a fresh executor."));
    case Verdict::kCrashed:
      return absl::InternalError(absl::StrCat(
          name, " crashed its kregd executor (pid ", exec.pid, ", ", exec.group,
          "): ", how,
          ". kregd and other clients are unaffected; the next call starts a "
          "fresh executor.",
          quarantine));
    case Verdict::kLostGpuWork:
      return absl::InternalError(absl::StrCat(
          "the GPU work of the last call of ", name,
          " was lost: its kregd executor (pid ", exec.pid, ", ", exec.group,
          ") ended after the handler returned: ", how,
          gpu_only > 1 ? absl::StrCat("; ", gpu_only,
                                      " sessions of that executor had GPU "
                                      "work, so which kernel faulted is not "
                                      "known")
                       : std::string(),
          ". kregd and other executors are unaffected; the next call starts "
          "a fresh executor.",
          quarantine));
  }
  return absl::InternalError("unknown crash verdict");
}

}  // namespace kreg
