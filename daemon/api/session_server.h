// The session server of kregd: accepts client sessions on a Unix socket next
// to the gRPC socket (DESIGN §3). What serves
// a connection comes from a SessionFactory (kregd: a SessionBroker handing it
// to an executor, DESIGN §8), so this links no code that runs handlers.
// A session runs in steps on a pool of worker threads and waits between
// them on the server's ConnectionParker, so a waiting connection holds no
// thread (docs/design.md §6).
#ifndef KREGD_DAEMON_API_SESSION_SERVER_H_
#define KREGD_DAEMON_API_SESSION_SERVER_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"
#include "daemon/base/connection_parker.h"
#include "daemon/base/served_session.h"
#include "daemon/base/uid_account.h"
#include "daemon/base/unix_listener.h"

namespace kreg {

struct SessionOptions {
  // Where to listen (the gRPC socket path + ".session"); ignored when
  // listen_fd >= 0. Created with mode 0660.
  std::string socket_path;
  // An inherited listening socket (systemd); not closed by Stop().
  int listen_fd = -1;
  // Group of the socket file when >= 0.
  gid_t socket_gid = static_cast<gid_t>(-1);
  // Further connections are refused with an error beyond this many
  // sessions, in all and per client uid (so one uid cannot starve others).
  // The per-uid count is charged to `account` (UidResource::kSessions) when
  // set (kregd: its one per-uid account, whose limit is then used), else to
  // the server's own account with max_sessions_per_uid.
  int max_sessions = 1024;
  int max_sessions_per_uid = 256;
  UidAccount* account = nullptr;  // must outlive the server
  // Whether what serves a connection says what it is (kregd's brokers):
  // then a new connection is charged to its uid's connections waiting for
  // their first request (UidResource::kPendingConnections) until
  // IsASession or NotASession; else it is a session from accept.
  bool classify = false;
};

// Makes what serves one accepted connection (kregd: a SessionBroker that
// hands it to an executor; tests: a Session over a fake backend).
using SessionFactory = std::function<std::shared_ptr<ServedSession>(
    uint64_t id, UniqueFd sock, const PeerCred& peer)>;

// Owns the listening socket, the accept thread and every session the
// factory made. Thread-safe.
class SessionServer {
 public:
  SessionServer(const SessionOptions& opts, SessionFactory factory);
  ~SessionServer();
  SessionServer(const SessionServer&) = delete;
  SessionServer& operator=(const SessionServer&) = delete;

  // Listens (or adopts opts.listen_fd) and starts the accept thread.
  // INTERNAL/FAILED_PRECONDITION with the path and errno text on failure.
  absl::Status Start();
  // Stops accepting, closes every session and joins all threads. Idempotent.
  void Stop();

  int sessions() const { return live_sessions_.load(); }
  // An id for a session that did not come through this server's socket.
  uint64_t NextId() { return next_id_.fetch_add(1); }
  // Serves `session` like an accepted one, of client uid `uid` (a session
  // a re-adopted executor brought along, DESIGN §12: counted, not refused
  // for limits). False once stopping.
  bool Serve(std::shared_ptr<ServedSession> session, uid_t uid);
  // With opts.classify: connection `id` said Hello, so it is a session
  // from now on (charged to its uid's sessions instead of its pending
  // connections); RESOURCE_EXHAUSTED naming max_sessions_per_uid when its
  // uid has its share already. Thread-safe.
  absl::Status IsASession(uint64_t id);
  // Connection `id` turned out not to be a session (a control connection,
  // charged on its own account): it no longer counts against max_sessions
  // and its uid's sessions or pending connections. Thread-safe.
  void NotASession(uint64_t id);

 private:
  struct Slot {
    std::shared_ptr<ServedSession> session;
    bool done = false;  // its last step ran: the accept loop destroys it
    // Its uid's session or pending connection (given back when the
    // session ends or is not one); `counted`: it counts in live_sessions_.
    UidAccount::Charge charge;
    bool counted = true;
  };

  absl::Status Listen();
  void AcceptLoop();
  void StartSession(UniqueFd sock);
  void RunSession(std::shared_ptr<ServedSession> session,
                  UidAccount::Charge charge) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs the next step of `slot`'s session and parks it until the one
  // after, or finishes it.
  void Advance(Slot* slot, ConnectionParker::Wake why);
  void Finish(Slot* slot);
  void ReapFinished();

  const SessionOptions opts_;
  SessionFactory factory_;
  std::unique_ptr<UnixListener> own_listener_;  // unless inherited
  int listen_fd_ = -1;
  UniqueFd wake_fd_;  // eventfd that stops the accept loop
  std::thread accept_thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> live_sessions_{0};
  std::atomic<uint64_t> next_id_{1};
  absl::Mutex mu_;
  std::list<Slot> slots_ ABSL_GUARDED_BY(mu_);
  // Where sessions wait between steps (no thread each).
  ConnectionParker parker_;
  std::unique_ptr<UidAccount> own_account_;  // unless opts_.account
  UidAccount* account_;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_API_SESSION_SERVER_H_
