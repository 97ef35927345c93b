// What kregd-compile does to itself before it runs a compiler (DESIGN §13,
// docs/operator-guide.md "The compile service"): its own mount, network,
// IPC and PID namespaces, every mount read-only but a private tmpfs scratch
// directory, a proc of its own, the caller's credentials, no new
// privileges (and the seccomp filter of daemon/base/hardening.h,
// InstallCompilerSeccompFilter); and the limits the compiler's processes
// run under.
#ifndef KREGD_DAEMON_KREGD_COMPILE_SANDBOX_H_
#define KREGD_DAEMON_KREGD_COMPILE_SANDBOX_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kreg {

// unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC), mounts made private,
// every mount read-only (recursively), then a tmpfs of `scratch_bytes` on
// `scratch` (owned by uid:gid, mode 0700). Needs root. INTERNAL naming the
// step and errno.
absl::Status EnterSandbox(const std::string& scratch, uint64_t scratch_bytes,
                          uid_t uid, gid_t gid);

// unshare(CLONE_NEWPID), then fork: 0 in the child, which is PID 1 of a
// new PID namespace (when it ends, the kernel kills every process left in
// the namespace); the child's pid in the parent. Needs root. INTERNAL
// naming the step and errno.
absl::StatusOr<pid_t> ForkIntoPidNamespace();

// In the child of ForkIntoPidNamespace, inside EnterSandbox's mount
// namespace: a fresh proc on /proc (nosuid, nodev, noexec), so /proc shows
// the compile's own processes only (no /proc/<pid>/root of a host process).
absl::Status MountOwnProc();

// Threads (tasks) running as real uid `uid` now (what RLIMIT_NPROC
// counts), from /proc.
uint64_t TasksOfUid(uid_t uid);

struct ChildLimits {
  uint64_t cpu_s = 0;         // RLIMIT_CPU
  uint64_t memory_bytes = 0;  // RLIMIT_AS
  uint64_t output_bytes = 0;  // RLIMIT_FSIZE
  uint64_t nproc = 0;         // RLIMIT_NPROC (absolute)
};

// setrlimit of each (soft = hard), in the forked child before exec. False
// when one fails (errno set).
bool ApplyChildLimits(const ChildLimits& limits);

}  // namespace kreg

#endif  // KREGD_DAEMON_KREGD_COMPILE_SANDBOX_H_
