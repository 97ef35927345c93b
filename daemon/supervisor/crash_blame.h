// Who is blamed when an executor dies (DESIGN §8, crash containment), as
// pure functions of what kregd knew and what the executor's status page said,
// and the error each affected session's call gets. No locks, no I/O:
// ExecutorPool decides under its lock, records crashes and logs after it.
#ifndef KREGD_DAEMON_SUPERVISOR_CRASH_BLAME_H_
#define KREGD_DAEMON_SUPERVISOR_CRASH_BLAME_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/base/types.h"
#include "daemon/supervisor/crash_ledger.h"

namespace kreg {

// One session slot of the dead executor. The tokens come from the status
// page and are untrusted (range-checked against BlameInput::resolved).
struct BlameSlot {
  bool used = false;       // a session was bound to it (kregd's record)
  uint32_t token = 0;      // ExecSlot::token: the handler running (0: none)
  uint32_t gpu_token = 0;  // ExecSlot::gpu_token: its last CUDA launch
};

struct BlameInput {
  std::vector<BlameSlot> slots;
  // Tokens kregd handed this executor: 1..resolved name a target.
  uint32_t resolved = 0;
  // ExecStatusHeader::faulted_slot (1 + slot; 0: not known; untrusted).
  uint32_t faulted_slot = 0;
  // The executor's sticky-error watch found a GPU fault after the
  // handlers had returned (ExecStatusHeader::recycle == 2).
  bool gpu_fault = false;
  // kregd was stopping the executor: no crash counts against a target.
  bool stop_requested = false;
};

enum class Verdict {
  kCrashed,      // its handler was running and is blamed (INTERNAL)
  kInterrupted,  // another session's handler crashed the executor (ABORTED)
  kLostGpuWork,  // its handler had returned; its GPU work was lost (INTERNAL)
};

struct SlotBlame {
  uint32_t slot = 0;
  uint32_t token = 0;  // the target its call is about (1..resolved)
  Verdict verdict = Verdict::kCrashed;
  // The crash counts against the target for the slot's uid (CrashLedger).
  bool counted = false;
};

struct CrashBlame {
  // Every affected slot (a used slot with a valid token), in slot order.
  std::vector<SlotBlame> slots;
  // The slot whose handler took the fatal signal, when the executor named
  // one that was running a known target; -1 otherwise.
  int64_t culprit = -1;
  // With gpu_fault: the sessions with GPU work but no handler running.
  // Only when it is 1 is which kernel faulted known (and counted).
  int gpu_only = 0;
};

// The decision: a session whose handler ran is blamed for the crash, unless
// the executor named another running session as the one that faulted (then
// it was interrupted, and not counted); with a GPU fault found after the
// handlers returned, each session's last CUDA target lost its GPU work,
// counted only when that session was the only one with GPU work.
CrashBlame DecideBlame(const BlameInput& in);

// How the executor ended, for the texts.
struct ExecutorEnd {
  std::string wait_text;  // DescribeWaitStatus(): "was killed by signal ..."
  bool sigkill = false;   // it ended by SIGKILL
  std::string killed_because;  // why kregd killed it (empty: kregd did not)
  bool stop_requested = false;
  std::string note;  // the status page's last words
};
// "it was killed by signal 11 (...)", kregd's reason, ... plus the note.
std::string DescribeEnd(const ExecutorEnd& end);

// `target "name" (platform, content ..., function ..., module ...)`.
std::string DescribeTarget(const TargetEntry& e);

// " The target is now quarantined ..." / " (crash 1 of 3 within ...)" / "".
std::string QuarantineNote(const CrashRecord& rec, const CrashPolicy& policy);

// Names the dead executor in the texts.
struct ExecutorName {
  pid_t pid = 0;
  std::string group;  // "uid 1000", "shared", ...
};

// The error of one affected session's call: ABORTED "... was interrupted
// ..." naming `culprit` for kInterrupted, INTERNAL otherwise. `quarantine`
// is QuarantineNote's text for a counted crash (else empty).
absl::Status CrashError(const SlotBlame& slot, const TargetEntry& target,
                        const TargetEntry* culprit, const ExecutorName& exec,
                        const std::string& how, int gpu_only,
                        const std::string& quarantine);

}  // namespace kreg

#endif  // KREGD_DAEMON_SUPERVISOR_CRASH_BLAME_H_
