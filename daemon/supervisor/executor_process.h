// One executor process as ExecutorPool drives it (DESIGN §8). Executor
// (executor.h) is the real one, kregd-exec started with posix_spawn; tests
// give the pool a launcher of fakes, so it can be tested without processes.
#ifndef KREGD_DAEMON_SUPERVISOR_EXECUTOR_PROCESS_H_
#define KREGD_DAEMON_SUPERVISOR_EXECUTOR_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"
#include "daemon/base/status_page.h"
#include "kreg/v1/executor.pb.h"

namespace kreg {

// Thread-safe.
class ExecutorProcess {
 public:
  virtual ~ExecutorProcess() = default;

  // Hands a client's session socket to the executor; returns kregd's end of
  // the session's new broker socket. UNAVAILABLE when the executor is gone.
  virtual absl::StatusOr<UniqueFd> Adopt(const v1::ExecAdopt& adopt,
                                         int client_fd) = 0;
  // Re-pointing (docs/replace.md section 3): sends `repoint` with
  // `module_fd` (the module's store copy) attached on the control socket.
  // UNAVAILABLE when the executor is gone. Fakes: UNIMPLEMENTED.
  virtual absl::Status SendRepoint(const v1::ExecRepoint& repoint,
                                   int module_fd) {
    return absl::UnimplementedError("this executor cannot be re-pointed");
  }
  // Waits until `deadline` for the executor's ExecRepointAck of `repoint`
  // (or a later generation): its status (OK: switched), DEADLINE_EXCEEDED
  // when none came in time, UNAVAILABLE when the control socket broke.
  virtual absl::Status AwaitRepointAck(const v1::ExecRepoint& repoint,
                                       absl::Time deadline) {
    return absl::UnimplementedError("this executor cannot be re-pointed");
  }
  // Closes the control socket: the executor finishes and exits.
  virtual void RequestStop() = 0;
  // Closes the control socket like RequestStop but leaves the executor
  // running (DESIGN §12: it serves its sessions on without kregd).
  virtual void Abandon() = 0;
  // Sends `sig` unless the process was reaped already.
  virtual void Signal(int sig) = 0;
  // Blocks until the process exits and returns its wait status; later
  // calls return the same status at once.
  virtual int Reap() = 0;

  virtual pid_t pid() const = 0;
  // kregd's mapping of the executor's status page.
  virtual const StatusPage& page() const = 0;
  // What the executor answered to its ExecInit.
  virtual const v1::ExecInitReply& info() const = 0;
};

// Starts an executor of `binary` with `init`, waiting up to `timeout` for
// its ExecInitReply (Executor::Start's contract and errors).
using ExecutorLauncher =
    std::function<absl::StatusOr<std::unique_ptr<ExecutorProcess>>(
        const std::string& binary, const v1::ExecInit& init,
        std::chrono::milliseconds timeout)>;

}  // namespace kreg

#endif  // KREGD_DAEMON_SUPERVISOR_EXECUTOR_PROCESS_H_
