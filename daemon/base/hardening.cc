#include "daemon/base/hardening.h"

#include <errno.h>
#include <grp.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/base/files.h"

namespace kreg {

void CloseDescriptorsFrom(int first) {
  if (::syscall(SYS_close_range, first, ~0U, 0) == 0) return;
  for (int fd = first; fd < 65536; ++fd) ::close(fd);
}

absl::Status DropPrivileges(uid_t uid, gid_t gid,
                            const std::vector<gid_t>& groups) {
  if (::setgroups(groups.size(), groups.data()) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "setgroups (", groups.size(), " groups) failed: ", strerror(errno)));
  }
  if (::setresgid(gid, gid, gid) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("setresgid(", gid, ") failed: ", strerror(errno)));
  }
  if (::setresuid(uid, uid, uid) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("setresuid(", uid, ") failed: ", strerror(errno)));
  }
  uid_t r, e, s;
  gid_t rg, eg, sg;
  if (::getresuid(&r, &e, &s) != 0 || r != uid || e != uid || s != uid ||
      ::getresgid(&rg, &eg, &sg) != 0 || rg != gid || eg != gid || sg != gid) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the switch to uid ", uid, " gid ", gid, " did not stick"));
  }
  if (uid != 0 && ::setresuid(0, 0, 0) == 0) {
    return absl::PermissionDeniedError(
        "the executor could regain root after dropping it");
  }
  return absl::OkStatus();
}

absl::Status TieToParent(pid_t parent_pid, bool die_with_parent) {
  if (die_with_parent && ::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
    return ErrnoError("PR_SET_PDEATHSIG");
  }
  if (::getppid() != parent_pid) {
    return absl::FailedPreconditionError(
        absl::StrCat("kregd (pid ", parent_pid, ") is gone"));
  }
  return absl::OkStatus();
}

namespace {

// `compiler`: InstallCompilerSeccompFilter's variant.
absl::Status LoadFilter(bool compiler) {
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
    return ErrnoError("PR_SET_NO_NEW_PRIVS");
  }
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (ctx == nullptr) return absl::InternalError("seccomp_init failed");
  const uint32_t deny = SCMP_ACT_ERRNO(EPERM);
  int rc = 0;
  for (const char* name : {"execve",
                           "execveat",
                           "ptrace",
                           "process_vm_readv",
                           "process_vm_writev",
                           "mount",
                           "umount2",
                           "bpf",
                           "keyctl",
                           "add_key",
                           "request_key",
                           "io_uring_setup",
                           "io_uring_enter",
                           "io_uring_register",
                           "perf_event_open",
                           "userfaultfd",
                           "init_module",
                           "finit_module",
                           "delete_module",
                           "kexec_load",
                           "kexec_file_load",
                           "unshare",
                           "setns",
                           "pivot_root",
                           "chroot",
                           "open_by_handle_at",
                           "swapon",
                           "swapoff",
                           "reboot",
                           "fsopen",
                           "fsmount",
                           "move_mount",
                           "open_tree"}) {
    if (compiler && std::strncmp(name, "execve", 6) == 0) continue;
    int nr = seccomp_syscall_resolve_name(name);
    if (nr == __NR_SCMP_ERROR) continue;  // not on this architecture
    rc = seccomp_rule_add(ctx, deny, nr, 0);
    if (rc != 0) break;
  }
  // socket(): only local families. One rule per denied family (a rule
  // cannot compare one argument twice), then everything above the last.
  for (int family = 0; rc == 0 && family < 64; ++family) {
    if (family == AF_UNIX || (family == AF_NETLINK && !compiler)) continue;
    rc = seccomp_rule_add(
        ctx, deny, SCMP_SYS(socket), 1,
        SCMP_A0(SCMP_CMP_EQ, static_cast<scmp_datum_t>(family)));
  }
  if (rc == 0) {
    rc = seccomp_rule_add(ctx, deny, SCMP_SYS(socket), 1,
                          SCMP_A0(SCMP_CMP_GE, 64));
  }
  if (compiler) {
    // clone(flags, ...): no new namespace of any kind.
    for (scmp_datum_t flag :
         {CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC,
          CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET}) {
      if (rc == 0) {
        rc = seccomp_rule_add(ctx, deny, SCMP_SYS(clone), 1,
                              SCMP_A0(SCMP_CMP_MASKED_EQ, flag, flag));
      }
    }
    if (rc == 0) {
      rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
    }
  }
  if (rc == 0) rc = seccomp_load(ctx);
  seccomp_release(ctx);
  if (rc != 0) {
    return absl::InternalError(
        absl::StrCat("installing the seccomp filter failed: ", strerror(-rc)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status InstallSeccompFilter() { return LoadFilter(false); }

absl::Status InstallCompilerSeccompFilter() { return LoadFilter(true); }

}  // namespace kreg
