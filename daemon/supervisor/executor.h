// One executor process as seen from kregd (DESIGN §8): kregd-exec started
// with posix_spawn, its control socket and its status page.
#ifndef KREGD_DAEMON_SUPERVISOR_EXECUTOR_H_
#define KREGD_DAEMON_SUPERVISOR_EXECUTOR_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"
#include "daemon/base/status_page.h"
#include "daemon/registry/repointer.h"
#include "daemon/supervisor/executor_process.h"
#include "kreg/v1/executor.pb.h"

namespace kreg {

// Owns the child process (through a pidfd, so a signal can never hit a
// recycled pid), kregd's end of its control socket and kregd's mapping of
// its status page. Thread-safe. The destructor stops the process (closes
// the control socket, then SIGKILL after a grace period) unless Reap()
// already collected it.
class Executor final : public ExecutorProcess {
 public:
  // Spawns `binary` (posix_spawn, its own process group, fds 3 = control,
  // 4 = status page, nothing else of kregd's), sends `init` and waits up to
  // `timeout` for its ExecInitReply. UNAVAILABLE naming the binary and what
  // happened (could not start, exited with code N, killed by signal, no
  // reply in time, refused: its message).
  static absl::StatusOr<std::unique_ptr<Executor>> Start(
      const std::string& binary, const v1::ExecInit& init,
      std::chrono::milliseconds timeout);
  // An executor an earlier kregd started (DESIGN §12), offered on the
  // supervision socket with `control` its connection: not kregd's child,
  // so Reap() waits on a pidfd and reads how it ended from its status page
  // (ExecStatusHeader::exit_status; unknown: as if killed by SIGKILL).
  // UNAVAILABLE when `pid` is gone already.
  static absl::StatusOr<std::unique_ptr<Executor>> Readopt(
      pid_t pid, UniqueFd control, StatusPage page, v1::ExecInitReply info);
  ~Executor() override;
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // ExecutorProcess. After Abandon() the destructor neither waits for the
  // process nor kills it.
  absl::StatusOr<UniqueFd> Adopt(const v1::ExecAdopt& adopt,
                                 int client_fd) override;
  absl::Status SendRepoint(const v1::ExecRepoint& repoint,
                           int module_fd) override;
  absl::Status AwaitRepointAck(const v1::ExecRepoint& repoint,
                               absl::Time deadline) override;
  void RequestStop() override;
  void Abandon() override;
  void Signal(int sig) override;
  int Reap() override;
  pid_t pid() const override { return pid_; }
  const StatusPage& page() const override { return page_; }
  const v1::ExecInitReply& info() const override { return info_; }

 private:
  Executor(pid_t pid, UniqueFd pidfd, UniqueFd control, StatusPage page);

  const pid_t pid_;
  bool child_ = true;  // started by this kregd (waitpid works)
  UniqueFd pidfd_;
  StatusPage page_;
  v1::ExecInitReply info_;
  absl::Mutex control_mu_;
  UniqueFd control_ ABSL_GUARDED_BY(control_mu_);
  // One reader of the control socket at a time (AwaitRepointAck); the
  // acks it read, by "platform/name": the latest generation's.
  absl::Mutex read_mu_;
  absl::Mutex acks_mu_;
  std::map<std::string, v1::ExecRepointAck> acks_ ABSL_GUARDED_BY(acks_mu_);
  absl::Mutex reap_mu_;
  bool reaped_ ABSL_GUARDED_BY(reap_mu_) = false;
  // Not under reap_mu_: Reap() holds that while it waits for the process.
  std::atomic<bool> abandoned_{false};
  int wait_status_ ABSL_GUARDED_BY(reap_mu_) = 0;
};

// "killed by signal 11 (SIGSEGV, Segmentation fault)", "exited with code
// 3", "exited normally".
std::string DescribeWaitStatus(int wait_status);

}  // namespace kreg

#endif  // KREGD_DAEMON_SUPERVISOR_EXECUTOR_H_
