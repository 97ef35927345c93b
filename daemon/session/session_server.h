// The session server of kregd: accepts client sessions on a Unix socket next
// to the gRPC socket and runs one thread per session (DESIGN §3).
#ifndef KREGD_DAEMON_SESSION_SESSION_SERVER_H_
#define KREGD_DAEMON_SESSION_SESSION_SERVER_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/session/session.h"
#include "daemon/unique_fd.h"

namespace kreg {

class CudaDevices;
class FfiHost;
class Registrar;
class Registry;

struct SessionOptions {
  // Where to listen (the gRPC socket path + ".session"); ignored when
  // listen_fd >= 0. Created with mode 0660.
  std::string socket_path;
  // An inherited listening socket (systemd); not closed by Stop().
  int listen_fd = -1;
  // Group of the socket file when >= 0.
  gid_t socket_gid = static_cast<gid_t>(-1);
  uint64_t max_arena_bytes = 4ull << 30;
  uint64_t max_message_bytes = 64ull << 20;
  // Busy-poll per session for the next request after each reply (µs; 0:
  // block at once). $KREGD_SESSION_SPIN_US overrides it.
  int64_t spin_us = 0;
  // Further connections are refused (closed) beyond this many sessions.
  int max_sessions = 1024;
  // kregd's GPUs (CudaDevices::OpenSystem at daemon start); null: CUDA
  // launches are refused. Must outlive the server.
  CudaDevices* cuda_devices = nullptr;
};

// Owns the listening socket, the accept thread and every session (and so
// every session's arena). Thread-safe. The registrar, registry and host must
// outlive it.
class SessionServer {
 public:
  SessionServer(const SessionOptions& opts, Registrar* registrar,
                Registry* registry, FfiHost* host);
  // Test seam: serve over any backend (must outlive the server).
  SessionServer(const SessionOptions& opts,
                std::unique_ptr<SessionBackend> backend);
  ~SessionServer();
  SessionServer(const SessionServer&) = delete;
  SessionServer& operator=(const SessionServer&) = delete;

  // Listens (or adopts opts.listen_fd) and starts the accept thread.
  // INTERNAL/FAILED_PRECONDITION with the path and errno text on failure.
  absl::Status Start();
  // Stops accepting, closes every session and joins all threads. Idempotent.
  void Stop();

  int sessions() const { return live_sessions_.load(); }
  uint64_t launches() const { return counters_.launches.load(); }
  uint64_t launch_errors() const { return counters_.launch_errors.load(); }

 private:
  struct Slot {
    std::shared_ptr<Session> session;
    std::thread thread;
    std::atomic<bool> done{false};
  };

  absl::Status Listen();
  void AcceptLoop();
  void StartSession(UniqueFd sock);
  void ReapFinished();

  const SessionOptions opts_;
  std::unique_ptr<SessionBackend> backend_;
  SessionCounters counters_;
  UniqueFd own_listen_fd_;
  int listen_fd_ = -1;
  UniqueFd wake_fd_;  // eventfd that stops the accept loop
  std::thread accept_thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> live_sessions_{0};
  std::atomic<uint64_t> next_id_{1};
  absl::Mutex mu_;
  std::list<Slot> slots_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kreg

#endif  // KREGD_DAEMON_SESSION_SESSION_SERVER_H_
