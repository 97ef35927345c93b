// The supervision socket (DESIGN §12): executors an earlier kregd left
// running offer themselves here. Anybody may connect (executors run as
// their callers' uids), so every offer is read within bounds and a
// deadline and checked (adoption.h) before anything of it is used; what
// passes goes to the handler, which takes the executor over.
#ifndef KREGD_DAEMON_SUPERVISOR_READOPT_LISTENER_H_
#define KREGD_DAEMON_SUPERVISOR_READOPT_LISTENER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"
#include "daemon/base/adoption.h"
#include "daemon/base/status_page.h"
#include "daemon/base/types.h"
#include "daemon/base/unix_listener.h"
#include "kreg/v1/executor.pb.h"

namespace kreg {

// Bounds on one offer's frames (the ExecReadopt and each
// ExecReadoptSession) and on the targets a session may list.
constexpr uint32_t kMaxReadoptFrameBytes = 1 << 20;
constexpr int kMaxReadoptTokens = 4096;

// An offer that passed the checks.
struct ReadoptOffer {
  v1::ExecReadopt header;
  UniqueFd control;  // the connection: the executor's control socket
  std::optional<StatusPage> page;
  struct Session {
    uint64_t session_id = 0;  // the earlier kregd's id
    uint32_t slot = 0;
    PeerCred peer;    // SO_PEERCRED of the client's socket
    UniqueFd client;  // the client's session socket
    UniqueFd broker;  // kregd's end of the session's new broker socket
    std::vector<std::pair<TargetKey, uint32_t>> tokens;
    uint64_t states = 0;  // call-site states the session holds
  };
  std::vector<Session> sessions;
};

// Reads the rest of an offer from `conn` (whose SO_PEERCRED is `peer`)
// after `header` came with `page_fds` attached, and checks it: each
// session frame carries exactly a connected Unix stream socket (the
// client's) and a Unix socket, a slot in range, valid target names and
// platforms, at most `max_states` call-site states (0: unbounded). The
// page must be a sealed memfd of the header's slots.
// INVALID_ARGUMENT naming what is wrong; DEADLINE_EXCEEDED past
// `deadline`. Shared with the fuzzer.
absl::StatusOr<ReadoptOffer> ReadOfferSessions(
    int conn, v1::ExecReadopt header, std::vector<UniqueFd> page_fds,
    std::chrono::steady_clock::time_point deadline, uint64_t max_states = 0);

// Takes over a checked offer: OK when adopted; FAILED_PRECONDITION when the
// executor should be drained; another error refuses it. The message goes
// back to the executor and into kregd's log. `confirm` sends the executor
// its OK and must be called (false: the executor is gone) before anything
// else can be sent on the control socket, i.e. before a session can be
// bound to the executor; the handler fails no more after calling it.
using ReadoptHandler = std::function<absl::Status(
    ReadoptOffer offer, const std::function<bool()>& confirm)>;

// Owns the socket, its accept thread and a thread per offer being read.
// Each offer must arrive within kOfferDeadline; at most kMaxOffers are read
// at once, kMaxOffersPerUid of them from one uid (a connection beyond
// either is closed at once), so nobody can hold the socket against the
// executors that need it.
class ReadoptListener {
 public:
  static constexpr std::chrono::seconds kOfferDeadline{5};
  static constexpr int kMaxOffers = 16;
  static constexpr int kMaxOffersPerUid = 4;

  ReadoptListener(std::string path, AdoptionPolicy policy,
                  ReadoptHandler handler);
  ~ReadoptListener();  // Stop()
  ReadoptListener(const ReadoptListener&) = delete;
  ReadoptListener& operator=(const ReadoptListener&) = delete;

  // Binds `path` (mode 0666: the offers are authenticated, not the
  // connections) and starts accepting.
  absl::Status Start();
  // Stops accepting and removes the socket. Idempotent.
  void Stop();

  uint64_t adopted() const { return adopted_.load(); }
  uint64_t refused() const { return refused_.load(); }

 private:
  struct Worker {
    std::thread thread;
    int fd = -1;  // the connection, shut down by Stop()
    uid_t uid = 0;
    bool done = false;
  };

  void AcceptLoop();
  void Serve(UniqueFd conn);
  // Joins finished workers; with `all`, shuts down and joins every one.
  void Reap(bool all);

  const std::string path_;
  const AdoptionPolicy policy_;
  const ReadoptHandler handler_;
  std::unique_ptr<UnixListener> listener_;
  UniqueFd wake_fd_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> adopted_{0};
  std::atomic<uint64_t> refused_{0};
  absl::Mutex mu_;
  std::list<Worker> workers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kreg

#endif  // KREGD_DAEMON_SUPERVISOR_READOPT_LISTENER_H_
