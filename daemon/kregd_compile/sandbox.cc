#include "daemon/kregd_compile/sandbox.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/base/files.h"

namespace kreg {
namespace {

absl::Status Fail(absl::string_view step) {
  return ErrnoError("sandbox:", step);
}

}  // namespace

absl::Status EnterSandbox(const std::string& scratch, uint64_t scratch_bytes,
                          uid_t uid, gid_t gid) {
  if (::unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC) != 0) {
    return Fail("unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC)");
  }
  // Nothing done here propagates back to the host's mounts.
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    return Fail("making / private");
  }
  // Every mount read-only, recursively (mount_setattr, Linux 5.12).
  mount_attr attr{};
  attr.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID;
  if (::syscall(SYS_mount_setattr, AT_FDCWD, "/", AT_RECURSIVE, &attr,
                sizeof(attr)) != 0) {
    return Fail("mount_setattr(/, read-only, recursive)");
  }
  std::string opts =
      absl::StrCat("size=", scratch_bytes,
                   ",mode=0700,nr_inodes=65536,uid=", uid, ",gid=", gid);
  if (::mount("kregd-compile", scratch.c_str(), "tmpfs", MS_NOSUID | MS_NODEV,
              opts.c_str()) != 0) {
    return Fail(absl::StrCat("mounting a tmpfs on ", scratch));
  }
  return absl::OkStatus();
}

absl::StatusOr<pid_t> ForkIntoPidNamespace() {
  if (::unshare(CLONE_NEWPID) != 0) return Fail("unshare(CLONE_NEWPID)");
  const pid_t child = ::fork();
  if (child < 0) return Fail("fork into the new PID namespace");
  return child;
}

absl::Status MountOwnProc() {
  if (::mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              nullptr) != 0) {
    return Fail("mounting a proc of the compile's PID namespace on /proc");
  }
  return absl::OkStatus();
}

uint64_t TasksOfUid(uid_t uid) {
  uint64_t tasks = 0;
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return 0;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream status(absl::StrCat("/proc/", e->d_name, "/status"));
    std::string line;
    bool mine = false;
    uint64_t threads = 0;
    while (std::getline(status, line)) {
      if (line.rfind("Uid:", 0) == 0) {
        unsigned long real = 0;
        mine = std::sscanf(line.c_str() + 4, "%lu", &real) == 1 && real == uid;
      } else if (line.rfind("Threads:", 0) == 0) {
        (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(8)),
                               &threads);
      }
    }
    if (mine) tasks += threads;
  }
  ::closedir(d);
  return tasks;
}

bool ApplyChildLimits(const ChildLimits& limits) {
  static const rlimit kNoCore{0, 0};
  auto set = [](int resource, uint64_t value) {
    if (value == 0) return true;
    rlimit r{value, value};
    return ::setrlimit(resource, &r) == 0;
  };
  // CPU: SIGXCPU at the soft limit (the compiler driver reports "CPU time
  // limit exceeded"), SIGKILL a second later.
  const rlimit cpu{limits.cpu_s, limits.cpu_s + 1};
  if (limits.cpu_s != 0 && ::setrlimit(RLIMIT_CPU, &cpu) != 0) return false;
  return set(RLIMIT_AS, limits.memory_bytes) &&
         set(RLIMIT_FSIZE, limits.output_bytes) &&
         set(RLIMIT_NPROC, limits.nproc) &&
         ::setrlimit(RLIMIT_CORE, &kNoCore) == 0;
}

}  // namespace kreg
