// What kregd needs from a session without linking the code that runs
// kernels (DESIGN §8: kregd never runs a handler): the interface of one
// served connection, the counters an executor's sessions share with kregd
// through the status page, and the socket helpers both sides use. The
// concrete Session (session.h) is the executor's.
#ifndef KREGD_DAEMON_BASE_SERVED_SESSION_H_
#define KREGD_DAEMON_BASE_SERVED_SESSION_H_

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/base/connection_parker.h"
#include "daemon/base/types.h"

namespace kreg {
namespace v1 {
class SessionStatus;
}

// What a served connection waits for before its next step: new bytes on
// `fd` (or its peer closing) until `deadline`; or nothing (it is done).
struct NextStep {
  static NextStep Done() { return NextStep(); }
  static NextStep WaitFor(int fd, absl::Time deadline) {
    NextStep n;
    n.fd = fd;
    n.deadline = deadline;
    return n;
  }
  bool done() const { return fd < 0; }
  int fd = -1;
  absl::Time deadline = absl::InfiniteFuture();
};

// One served connection: a Session running launches itself (an executor),
// or kregd's SessionBroker that hands the connection to an executor.
class ServedSession {
 public:
  virtual ~ServedSession() = default;
  // Serves until the connection ends.
  virtual void Run() = 0;
  // Serves one step (the session server calls it on a worker thread, first
  // with kStart) and says what to wait for before the next, so that a
  // connection that waits holds no thread (daemon/base/connection_parker.h).
  // The default serves the whole connection in one step (Run).
  virtual NextStep Step(ConnectionParker::Wake why) {
    (void)why;
    Run();
    return NextStep::Done();
  }
  // Makes a blocked Run() return. Thread-safe.
  virtual void Shutdown() = 0;
  virtual uint64_t id() const = 0;
  virtual const PeerCred& peer() const = 0;
};

// Counters shared by all sessions of a process. Lives in the executor's
// status page (status_page.h), so its layout is part of that page's.
struct SessionCounters {
  std::atomic<uint64_t> launches{0};
  std::atomic<uint64_t> launch_errors{0};
};

// Sends a connection-level error on a session socket: a SessionResponse
// with id 0 carrying `status`, which the client reports and after which it
// drops the session (session limits, a missing Hello, an oversized frame,
// an executor that died during the call). Best effort; errors are ignored.
void SendConnectionError(int sock, const absl::Status& status);

// The one mapping between absl::Status and the protocol's SessionStatus
// (code: absl's number; a code absl does not know reads as UNKNOWN).
void ToWireStatus(const absl::Status& status, v1::SessionStatus* out);
absl::Status FromWireStatus(const v1::SessionStatus& status);

// SO_PEERCRED of a connected Unix socket. INTERNAL if unavailable.
absl::StatusOr<PeerCred> PeerCredOf(int sock);

}  // namespace kreg

#endif  // KREGD_DAEMON_BASE_SERVED_SESSION_H_
