// The gRPC socket's connections, from accept to close (operator guide, "The
// gRPC socket"). kregd accepts each itself, records its peer's credentials
// (SO_PEERCRED) and bounds what connections hold before gRPC spends anything on
// them:
// - at most max_connections in all and, charged to the per-uid account
//   (UidResource::kGrpcConnections, max_grpc_connections_per_uid), a uid's
//   share (counted from accept until the peer closes); one over either is
//   closed at once, with a rate-limited log line naming the uid and the
//   limit;
// - a new connection waits here, costing one descriptor, until its first
//   bytes arrive: then gRPC gets it (grpc::AddInsecureChannelFromFd); one
//   that sends nothing within first_message_timeout is closed;
// - when descriptors run out (EMFILE, ENFILE) accepting pauses for a moment
//   instead of spinning, with one rate-limited log line.
// gRPC does not say when a connection it serves closes: a dup of each,
// polled for POLLRDHUP, does.
#ifndef KREGD_DAEMON_API_GRPC_CONNECTIONS_H_
#define KREGD_DAEMON_API_GRPC_CONNECTIONS_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"
#include "daemon/base/log_limit.h"
#include "daemon/base/types.h"
#include "daemon/base/uid_account.h"

namespace kreg {

struct GrpcConnectionLimits {
  int max_connections = 1024;
  std::chrono::milliseconds first_message_timeout{10000};
};

class GrpcConnections {
 public:
  using Clock = std::chrono::steady_clock;
  // `hand_over` gives gRPC a connection (it owns the descriptor from then).
  // `account` (per-uid connections) must outlive this.
  GrpcConnections(GrpcConnectionLimits limits, UidAccount* account,
                  std::function<void(int fd)> hand_over);
  GrpcConnections(const GrpcConnections&) = delete;
  GrpcConnections& operator=(const GrpcConnections&) = delete;

  // Accepts on `listen_fd` until `stop_fd` is readable, then closes the
  // connections still waiting and its dups (PeerOf still answers for the
  // connections gRPC serves).
  void Run(int listen_fd, int stop_fd);

  // The credentials of gRPC peer "fd:<n>"; PeerCred{} (uid -1) when no
  // connection gRPC serves has that name.
  PeerCred PeerOf(const std::string& grpc_peer);

 private:
  struct Conn {
    UniqueFd fd;       // waiting: the connection; served: a dup of gRPC's
    int grpc_fd = -1;  // gRPC's descriptor, once handed over
    uint64_t id = 0;
    PeerCred peer;
    Clock::time_point deadline;  // for the first bytes, while waiting
    UidAccount::Charge charge;   // its uid's connection
  };
  // Accepts what is pending on `listen_fd` (pauses accepting on EMFILE).
  void Accept(int listen_fd);
  // The charge of a new connection from `uid`, or the refusal over a
  // limit.
  absl::StatusOr<UidAccount::Charge> Admit(uid_t uid);
  // Gives gRPC `c`, keeping a dup; false (nothing given) if dup fails.
  bool HandOver(Conn* c);
  void Drop(size_t i);  // closes conns_[i] and forgets it
  void LogFor(uid_t uid, const std::string& line);

  const GrpcConnectionLimits limits_;
  UidAccount* const account_;
  const std::function<void(int)> hand_over_;
  // Only Run's thread touches these.
  std::vector<Conn> conns_;
  uint64_t next_id_ = 0;
  Clock::time_point accept_resumes_;
  absl::Mutex mu_;
  // gRPC peer name ("fd:<n>") -> the connection's id and credentials.
  std::map<std::string, std::pair<uint64_t, PeerCred>> peers_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace kreg

#endif  // KREGD_DAEMON_API_GRPC_CONNECTIONS_H_
