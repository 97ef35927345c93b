// What an executor does to itself before it runs anybody's kernel (DESIGN
// §8): take the caller's credentials, tie its life to kregd's, refuse new
// privileges, install a seccomp filter, keep no descriptor of kregd's.
#ifndef KREGD_DAEMON_BASE_HARDENING_H_
#define KREGD_DAEMON_BASE_HARDENING_H_

#include <sys/types.h>

#include <vector>

#include "absl/status/status.h"

namespace kreg {

// Closes every descriptor >= `first`.
void CloseDescriptorsFrom(int first);

// setgroups(groups), then gid, then uid (real, effective and saved).
// PERMISSION_DENIED naming the ids when the switch fails or does not stick.
absl::Status DropPrivileges(uid_t uid, gid_t gid,
                            const std::vector<gid_t>& groups);

// With `die_with_parent`, SIGKILL when the parent dies (set after the uid
// switch, which clears it); FAILED_PRECONDITION when the parent is not
// `parent_pid` any more.
absl::Status TieToParent(pid_t parent_pid, bool die_with_parent);

// PR_SET_NO_NEW_PRIVS, then a seccomp filter that answers EPERM to what
// kernels never need: execve/execveat, ptrace, process_vm_readv/writev,
// mount/umount, bpf, keyctl/add_key/request_key, io_uring (which would
// bypass the socket rule), perf_event_open, userfaultfd, module loading,
// namespaces (unshare/setns), and socket() of any family but AF_UNIX and
// AF_NETLINK. Other architectures' system calls kill the process.
absl::Status InstallSeccompFilter();

// The compile worker's filter (daemon/compile_service, DESIGN §13), for a
// compiler and what it runs: as InstallSeccompFilter but execve/execveat
// allowed, socket() of AF_UNIX only, clone() with a CLONE_NEW* flag refused and
// clone3 answered ENOSYS (its flags cannot be inspected; glibc then falls
// back to clone).
absl::Status InstallCompilerSeccompFilter();

}  // namespace kreg

#endif  // KREGD_DAEMON_BASE_HARDENING_H_
