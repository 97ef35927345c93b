#include "daemon/api/grpc_connections.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/base/unix_listener.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

// accept4 for a connection that is then handed to gRPC. Its own function
// so that TSan runs can name it (tools/tsan.supp): gRPC closes the
// descriptor in code TSan does not see, so TSan still ties the number to
// this accept when kregd reuses it for a memfd (memfd_create is not
// intercepted either) and reports that reuse as a race.
int AcceptForGrpc(int listen_fd) {
  return ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
}

int MillisUntil(GrpcConnections::Clock::time_point t) {
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(
      t - GrpcConnections::Clock::now());
  return static_cast<int>(std::clamp<int64_t>(ms.count(), 0, 60000));
}

}  // namespace

GrpcConnections::GrpcConnections(GrpcConnectionLimits limits,
                                 UidAccount* account,
                                 std::function<void(int)> hand_over)
    : limits_(limits), account_(account), hand_over_(std::move(hand_over)) {}

void GrpcConnections::Run(int listen_fd, int stop_fd) {
  // Accept takes what is pending until EAGAIN.
  ::fcntl(listen_fd, F_SETFL, ::fcntl(listen_fd, F_GETFL) | O_NONBLOCK);
  std::vector<pollfd> fds;
  while (true) {
    const bool accepting = Clock::now() >= accept_resumes_;
    int timeout = accepting ? -1 : MillisUntil(accept_resumes_);
    fds.assign({{stop_fd, POLLIN, 0}, {accepting ? listen_fd : -1, POLLIN, 0}});
    for (const Conn& c : conns_) {
      const bool waiting = c.grpc_fd < 0;
      // Not POLLIN once gRPC reads the connection: only its close.
      fds.push_back(
          {c.fd.get(),
           static_cast<short>(waiting ? POLLIN | POLLRDHUP : POLLRDHUP), 0});
      if (waiting) {
        int left = MillisUntil(c.deadline);
        timeout = timeout < 0 ? left : std::min(timeout, left);
      }
    }
    if (::poll(fds.data(), fds.size(), timeout) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("gRPC accept loop: poll: {}", std::strerror(errno));
      break;
    }
    if (fds[0].revents != 0) break;
    const Clock::time_point now = Clock::now();
    // Backwards: Drop moves the last connection (already seen) into i.
    for (size_t i = conns_.size(); i-- > 0;) {
      const short ev = fds[i + 2].revents;
      Conn& c = conns_[i];
      if (c.grpc_fd < 0 && (ev & POLLIN) != 0) {
        if (!HandOver(&c)) Drop(i);
      } else if ((ev & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
        Drop(i);
      } else if (c.grpc_fd < 0 && now >= c.deadline) {
        LogFor(c.peer.uid,
               absl::StrCat("closing a gRPC connection of uid ", c.peer.uid,
                            " (pid ", c.peer.pid, ") that sent nothing within ",
                            limits_.first_message_timeout.count(),
                            " ms (grpc_first_message_timeout_s)"));
        Drop(i);
      }
    }
    if ((fds[1].revents & POLLIN) != 0) Accept(listen_fd);
  }
  // gRPC's own descriptors stay open until its shutdown; PeerOf still
  // answers for the calls it finishes.
  conns_.clear();
}

void GrpcConnections::Accept(int listen_fd) {
  // A bounded batch, so that waiting connections' deadlines are kept.
  for (int batch = 0; batch < 64; ++batch) {
    UniqueFd fd(AcceptForGrpc(listen_fd));
    if (!fd.ok()) {
      accept_resumes_ = Clock::now() + AcceptFailed("gRPC socket", errno);
      return;
    }
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      spdlog::warn("SO_PEERCRED failed ({}); closing the connection",
                   std::strerror(errno));
      continue;
    }
    absl::StatusOr<UidAccount::Charge> charge = Admit(cred.uid);
    if (!charge.ok()) {
      LogFor(cred.uid, absl::StrCat("refusing a gRPC connection of pid ",
                                    cred.pid, ": ", charge.status().message()));
      continue;  // closing it refuses it
    }
    Conn c;
    c.charge = *std::move(charge);
    c.fd = std::move(fd);
    c.id = next_id_++;
    c.peer = PeerCred{cred.uid, cred.gid, cred.pid};
    c.deadline = Clock::now() + limits_.first_message_timeout;
    conns_.push_back(std::move(c));
  }
}

absl::StatusOr<UidAccount::Charge> GrpcConnections::Admit(uid_t uid) {
  if (conns_.size() >= static_cast<size_t>(limits_.max_connections)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "kregd holds ", conns_.size(), " gRPC connections already (limit ",
        limits_.max_connections, ", max_grpc_connections)"));
  }
  return account_->Take(uid, UidResource::kGrpcConnections, 1);
}

bool GrpcConnections::HandOver(Conn* c) {
  UniqueFd dup(::fcntl(c->fd.get(), F_DUPFD_CLOEXEC, 0));
  if (!dup.ok()) {
    // Without the dup its close would go unseen.
    LogFor(c->peer.uid,
           absl::StrCat("closing a gRPC connection of uid ", c->peer.uid,
                        ": dup: ", std::strerror(errno)));
    return false;
  }
  c->grpc_fd = c->fd.release();
  c->fd = std::move(dup);
  const std::string name = absl::StrCat("fd:", c->grpc_fd);
  {
    absl::MutexLock lock(&mu_);
    peers_[name] = {c->id, c->peer};
  }
  spdlog::debug("gRPC connection {} from uid {} pid {}", name, c->peer.uid,
                c->peer.pid);
  hand_over_(c->grpc_fd);
  return true;
}

void GrpcConnections::Drop(size_t i) {
  Conn& c = conns_[i];
  if (c.grpc_fd >= 0) {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(absl::StrCat("fd:", c.grpc_fd));
    if (it != peers_.end() && it->second.first == c.id) peers_.erase(it);
  }
  if (i + 1 != conns_.size()) c = std::move(conns_.back());
  conns_.pop_back();
}

void GrpcConnections::LogFor(uid_t uid, const std::string& line) {
  std::string suffix;
  if (PeerLogLimiter().Allow(absl::StrCat("uid ", uid), &suffix)) {
    spdlog::warn("{}{}", line, suffix);
  }
}

PeerCred GrpcConnections::PeerOf(const std::string& grpc_peer) {
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(grpc_peer);
  if (it == peers_.end()) {
    // A call whose connection closed before its handler ran (a client can
    // cause it, so rate-limited).
    std::string suffix;
    if (PeerLogLimiter().Allow("unknown gRPC peer", &suffix)) {
      spdlog::warn("no credentials recorded for gRPC peer {}{}", grpc_peer,
                   suffix);
    }
    return PeerCred{};
  }
  return it->second.second;
}

}  // namespace kreg
