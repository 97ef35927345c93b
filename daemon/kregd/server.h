// The kregd process, a shell around its parts (parts.h): it owns the core
// (store, journal, registry, crash ledger, account) and the listening
// sockets, starts the cluster, compile, sessions, metrics and gRPC parts
// in that order (no gRPC connection is accepted before the rest serves)
// and stops them in reverse. It hosts no handler: executors
// (kregd-exec) run them (DESIGN §8).
#ifndef KREGD_DAEMON_KREGD_SERVER_H_
#define KREGD_DAEMON_KREGD_SERVER_H_

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "daemon/base/unix_listener.h"
#include "daemon/kregd/parts.h"

namespace kreg {

class Daemon {
 public:
  explicit Daemon(Config config);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Replays the journal, listens (or adopts systemd's sockets), starts
  // the parts and tells systemd READY=1. Errors are for the operator.
  absl::Status Start();
  // Stops accepting, finishes in-flight calls (bounded), closes sessions.
  void Shutdown();
  // Shutdown() left executors serving their sessions (orphan_timeout): the
  // threads that wait for them use this object until the process exits, so
  // the caller must end the process without destroying it (_exit).
  bool left_executors() const { return sessions_.left_executors(); }

 private:
  // Takes the sockets systemd passed, or binds the configured one.
  absl::Status Listen();
  void WatchdogLoop(uint64_t interval_us);
  void FillStatus(v1::GetStatusResponse* resp);

  DaemonCore core_;
  ClusterPart cluster_;
  CompilePart compile_;
  SessionsPart sessions_;
  MetricsPart metrics_;
  GrpcPart grpc_;
  // In start order.
  const std::vector<DaemonPart*> parts_;
  UniqueFd listen_fd_;
  std::unique_ptr<UnixListener> listener_;  // unless inherited from systemd
  UniqueFd stop_fd_;                        // eventfd that wakes the watchdog
  std::thread watchdog_thread_;
  std::atomic<bool> stopping_{false};
};

}  // namespace kreg

#endif  // KREGD_DAEMON_KREGD_SERVER_H_
