#include "daemon/supervisor/executor.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/wire.h"
#include "daemon/base/files.h"
#include "daemon/base/served_session.h"
#include "daemon/base/spawn.h"
#include "spdlog/spdlog.h"

extern char** environ;

namespace kreg {
namespace {

// Variables an executor must not inherit: they describe kregd's own
// systemd sockets and notification channel.
bool InheritedVar(const char* kv) {
  for (const char* prefix :
       {"LISTEN_FDS=", "LISTEN_PID=", "LISTEN_FDNAMES=", "NOTIFY_SOCKET=",
        "WATCHDOG_USEC=", "WATCHDOG_PID="}) {
    if (absl::StartsWith(kv, prefix)) return false;
  }
  return true;
}

// A descriptor number >= 10 (so the spawn's dup2 to 3 and 4 never meets a
// fd that already has that number and keeps FD_CLOEXEC).
absl::StatusOr<UniqueFd> High(UniqueFd fd) {
  UniqueFd high(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 10));
  if (!high.ok()) {
    return ErrnoError("F_DUPFD");
  }
  return high;
}

// Waits up to `ms` for `fd` to be readable. False on timeout.
bool WaitReadable(int fd, int64_t ms) {
  pollfd p{fd, POLLIN, 0};
  for (;;) {
    int rc = ::poll(&p, 1, static_cast<int>(ms));
    if (rc < 0 && errno == EINTR) continue;
    return rc > 0;
  }
}

}  // namespace

std::string DescribeWaitStatus(int ws) {
  if (WIFSIGNALED(ws)) {
    int sig = WTERMSIG(ws);
    const char* abbrev = sigabbrev_np(sig);
    std::string text =
        absl::StrCat("was killed by signal ", sig, " (SIG",
                     abbrev ? abbrev : "?", ", ", strsignal(sig), ")");
    if (sig == SIGKILL) {
      absl::StrAppend(&text,
                      " — by kregd, the kernel's OOM killer or an operator");
    }
    return text;
  }
  if (WIFEXITED(ws)) {
    if (WEXITSTATUS(ws) == 0) return "exited normally";
    return absl::StrCat("exited with code ", WEXITSTATUS(ws));
  }
  return absl::StrCat("ended with wait status ", ws);
}

Executor::Executor(pid_t pid, UniqueFd pidfd, UniqueFd control, StatusPage page)
    : pid_(pid),
      pidfd_(std::move(pidfd)),
      page_(std::move(page)),
      control_(std::move(control)) {}

absl::StatusOr<std::unique_ptr<Executor>> Executor::Start(
    const std::string& binary, const v1::ExecInit& init,
    std::chrono::milliseconds timeout) {
  KREG_ASSIGN_OR_RETURN(StatusPage page, StatusPage::Create(init.slots()));
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return ErrnoError("socketpair");
  }
  UniqueFd ours(sv[0]);
  KREG_ASSIGN_OR_RETURN(UniqueFd theirs, High(UniqueFd(sv[1])));
  KREG_ASSIGN_OR_RETURN(UniqueFd page_fd,
                        High(UniqueFd(::fcntl(page.fd(), F_DUPFD_CLOEXEC, 0))));

  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (InheritedVar(*e)) env.push_back(*e);
  }
  env.push_back(nullptr);
  pid_t pid = 0;
  int rc = SpawnInOwnGroup(binary, {{theirs.get(), 3}, {page_fd.get(), 4}},
                           env.data(), &pid);
  theirs.reset();
  page_fd.reset();
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot start the executor ", binary, ": ", strerror(rc),
        " (is kregd-exec installed next to kregd? see --executor-binary)"));
  }
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  std::unique_ptr<Executor> exec(
      new Executor(pid, std::move(pidfd), std::move(ours), std::move(page)));
  auto fail = [&](const std::string& what) -> absl::Status {
    exec->Signal(SIGKILL);
    int ws = exec->Reap();
    return absl::UnavailableError(
        absl::StrCat("the executor for ", init.group(), " (", binary, ", pid ",
                     pid, ") failed to start: ", what, "; it ",
                     DescribeWaitStatus(ws), " (kregd's log has its output)"));
  };
  int control = -1;
  {
    // Not shared with another thread yet; locked for the annotation's sake.
    absl::MutexLock lock(&exec->control_mu_);
    control = exec->control_.get();
  }
  if (int s = wire::SendMessage(control, init); s != wire::kOk) {
    return fail("sending its configuration failed: " + wire::ResultText(s));
  }
  if (!WaitReadable(control, timeout.count())) {
    return fail(absl::StrCat("no answer within ", timeout.count(), " ms"));
  }
  int r = wire::RecvMessage(control, 1 << 16, &exec->info_);
  if (r == wire::kMalformed) return fail("a malformed answer");
  if (r != wire::kOk) return fail("no answer: " + wire::ResultText(r));
  if (exec->info_.status().code() != 0) {
    return fail(exec->info_.status().message());
  }
  return exec;
}

absl::StatusOr<std::unique_ptr<Executor>> Executor::Readopt(
    pid_t pid, UniqueFd control, StatusPage page, v1::ExecInitReply info) {
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!pidfd.ok()) {
    return absl::UnavailableError(
        absl::StrCat("executor pid ", pid,
                     " cannot be supervised: pidfd_open: ", strerror(errno)));
  }
  std::unique_ptr<Executor> exec(
      new Executor(pid, std::move(pidfd), std::move(control), std::move(page)));
  exec->child_ = false;
  exec->info_ = std::move(info);
  return exec;
}

Executor::~Executor() {
  RequestStop();
  {
    absl::MutexLock lock(&reap_mu_);
    if (reaped_ || abandoned_.load()) return;
  }
  if (!WaitReadable(pidfd_.get(), 2000)) {
    spdlog::warn(
        "killing executor pid {}: asked to stop, it did not exit "
        "within 2 s",
        pid_);
    Signal(SIGKILL);
  }
  Reap();
}

absl::StatusOr<UniqueFd> Executor::Adopt(const v1::ExecAdopt& adopt,
                                         int client_fd) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return ErrnoError("socketpair");
  }
  UniqueFd ours(sv[0]);
  UniqueFd theirs(sv[1]);
  int fds[2] = {client_fd, theirs.get()};
  absl::MutexLock lock(&control_mu_);
  if (!control_.ok()) {
    return absl::UnavailableError("the executor is stopping");
  }
  int rc = wire::SendMessage(control_.get(), adopt, fds, 2);
  if (rc != wire::kOk) {
    return absl::UnavailableError(
        absl::StrCat("handing the session to executor pid ", pid_,
                     " failed: ", wire::ResultText(rc)));
  }
  return ours;
}

absl::Status Executor::SendRepoint(const v1::ExecRepoint& repoint,
                                   int module_fd) {
  v1::ExecAdopt frame;
  *frame.mutable_repoint() = repoint;
  absl::MutexLock lock(&control_mu_);
  if (!control_.ok()) return absl::UnavailableError("the executor is stopping");
  int rc = wire::SendMessage(control_.get(), frame, &module_fd, 1);
  if (rc != wire::kOk) {
    return absl::UnavailableError(
        absl::StrCat("sending the re-point to executor pid ", pid_,
                     " failed: ", wire::ResultText(rc)));
  }
  return absl::OkStatus();
}

absl::Status Executor::AwaitRepointAck(const v1::ExecRepoint& repoint,
                                       absl::Time deadline) {
  const std::string id =
      absl::StrCat(repoint.platform(), "/", repoint.target_name());
  for (;;) {
    {
      absl::MutexLock lock(&acks_mu_);
      auto it = acks_.find(id);
      if (it != acks_.end() &&
          it->second.generation() >= repoint.generation()) {
        // The executor's word: a code absl does not know is UNKNOWN.
        return FromWireStatus(it->second.status());
      }
    }
    // Slices of 50 ms, so that waiters for other targets take turns reading;
    // what is there already is read even past the deadline.
    absl::ReleasableMutexLock reading(&read_mu_);
    UniqueFd fd;
    {
      absl::MutexLock lock(&control_mu_);
      if (!control_.ok()) {
        return absl::UnavailableError("the executor is stopping");
      }
      fd = UniqueFd(::fcntl(control_.get(), F_DUPFD_CLOEXEC, 0));
    }
    if (!fd.ok()) return ErrnoError("F_DUPFD");
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (!WaitReadable(fd.get(), std::clamp<int64_t>(left_ms, 0, 50))) {
      reading.Release();
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError("no acknowledgement in time");
      }
      continue;
    }
    wire::RecvBuffer buffer;
    std::vector<int> fds;
    int rc = wire::RecvFrame(
        fd.get(), kMaxRepointAckBytes, &buffer, &fds,
        wire::Clock::now() +
            std::chrono::milliseconds(std::max<int64_t>(
                absl::ToInt64Milliseconds(deadline - absl::Now()), 100)));
    for (int f : fds) ::close(f);
    v1::ExecRepointAck ack;
    if (rc != wire::kOk || !ack.ParseFromString(buffer.payload())) {
      spdlog::warn(
          "executor pid {}: unreadable frame on its control socket ({}); "
          "kregd stops reading it",
          pid_, rc != wire::kOk ? wire::ResultText(rc) : "not an ack");
      RequestStop();
      return absl::UnavailableError(
          absl::StrCat("executor pid ", pid_,
                       " sent an unreadable frame on its control socket"));
    }
    absl::MutexLock lock(&acks_mu_);
    v1::ExecRepointAck& slot =
        acks_[absl::StrCat(ack.platform(), "/", ack.target_name())];
    if (ack.generation() >= slot.generation()) slot = std::move(ack);
  }
}

void Executor::Abandon() {
  abandoned_.store(true);
  RequestStop();
}

void Executor::RequestStop() {
  absl::MutexLock lock(&control_mu_);
  control_.reset();
}

void Executor::Signal(int sig) {
  if (pidfd_.ok()) {
    ::syscall(SYS_pidfd_send_signal, pidfd_.get(), sig, nullptr, 0);
    return;
  }
  absl::MutexLock lock(&reap_mu_);
  if (!reaped_) ::kill(pid_, sig);
}

int Executor::Reap() {
  absl::MutexLock lock(&reap_mu_);
  if (reaped_) return wait_status_;
  if (!child_) {
    // Its parent (init or a subreaper) collects the status; the pidfd
    // turns readable when the process has exited.
    WaitReadable(pidfd_.get(), -1);
    const uint32_t said = page_.header()->exit_status.load();
    reaped_ = true;
    wait_status_ =
        (said & kExitKnown) != 0 ? static_cast<int>(said & 0xffff) : SIGKILL;
    return wait_status_;
  }
  int ws = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &ws, 0);
  } while (r < 0 && errno == EINTR);
  if (r < 0) {
    spdlog::warn("executor pid {}: waitpid: {}", pid_, strerror(errno));
  }
  reaped_ = true;
  wait_status_ = ws;
  return ws;
}

}  // namespace kreg
