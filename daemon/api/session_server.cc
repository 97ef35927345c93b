#include "daemon/api/session_server.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/wire.h"
#include "daemon/base/files.h"
#include "daemon/base/unix_listener.h"
#include "spdlog/spdlog.h"

namespace kreg {

namespace {

std::unique_ptr<UidAccount> OwnAccount(const SessionOptions& opts) {
  if (opts.account != nullptr) return nullptr;
  UidLimits limits{};
  limits[static_cast<size_t>(UidResource::kSessions)] =
      static_cast<uint64_t>(std::max(0, opts.max_sessions_per_uid));
  return std::make_unique<UidAccount>(limits);
}

}  // namespace

SessionServer::SessionServer(const SessionOptions& opts, SessionFactory factory)
    : opts_(opts),
      factory_(std::move(factory)),
      own_account_(OwnAccount(opts)),
      account_(opts.account != nullptr ? opts.account : own_account_.get()) {}

SessionServer::~SessionServer() { Stop(); }

absl::Status SessionServer::Listen() {
  if (opts_.listen_fd >= 0) {
    listen_fd_ = opts_.listen_fd;
    return absl::OkStatus();
  }
  KREG_ASSIGN_OR_RETURN(UnixListener l,
                        UnixListener::Bind(opts_.socket_path, 0660,
                                           opts_.socket_gid, "session socket"));
  own_listener_ = std::make_unique<UnixListener>(std::move(l));
  listen_fd_ = own_listener_->fd();
  return absl::OkStatus();
}

absl::Status SessionServer::Start() {
  KREG_RETURN_IF_ERROR(Listen());
  wake_fd_.reset(::eventfd(0, EFD_CLOEXEC));
  if (!wake_fd_.ok()) return ErrnoError("eventfd");
  KREG_RETURN_IF_ERROR(parker_.Start());
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  spdlog::info("sessions: listening on {}", opts_.listen_fd >= 0
                                                ? std::string("inherited fd")
                                                : opts_.socket_path);
  return absl::OkStatus();
}

void SessionServer::AcceptLoop() {
  std::chrono::milliseconds pause(0);
  while (!stopping_.load()) {
    // While paused (out of descriptors) only the wake-up is watched.
    pollfd fds[2] = {{pause.count() > 0 ? -1 : listen_fd_, POLLIN, 0},
                     {wake_fd_.get(), POLLIN, 0}};
    // Wakes up now and then to reap finished sessions (joins their threads,
    // closes their sockets) even when nobody connects.
    int ready = ::poll(fds, 2, pause.count() > 0 ? pause.count() : 1000);
    pause = std::chrono::milliseconds(0);
    if (ready < 0) {
      if (errno == EINTR) continue;
      spdlog::error("sessions: poll failed: {}", strerror(errno));
      return;
    }
    if (fds[1].revents != 0 || stopping_.load()) return;
    ReapFinished();
    if (ready == 0 || (fds[0].revents & POLLIN) == 0) continue;
    UniqueFd sock(::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC));
    if (!sock.ok()) {
      pause = AcceptFailed("session socket", errno);
      continue;
    }
    StartSession(std::move(sock));
  }
}

void SessionServer::StartSession(UniqueFd sock) {
  absl::StatusOr<PeerCred> peer = PeerCredOf(sock.get());
  if (!peer.ok()) return;  // logged; closing refuses the connection
  std::string refusal;
  UidAccount::Charge charge;
  {
    absl::MutexLock lock(&mu_);
    if (live_sessions_.load() >= opts_.max_sessions) {
      refusal = absl::StrCat("kregd serves ", opts_.max_sessions,
                             " sessions already (max_sessions); try again "
                             "later or ask the operator to raise it");
    } else if (absl::StatusOr<UidAccount::Charge> c = account_->Take(
                   peer->uid,
                   opts_.classify ? UidResource::kPendingConnections
                                  : UidResource::kSessions,
                   1);
               !c.ok()) {
      refusal = std::string(c.status().message());
    } else {
      charge = *std::move(c);
      live_sessions_.fetch_add(1);
    }
  }
  if (!refusal.empty()) {
    spdlog::warn("sessions: refusing pid {} (uid {}): {}", peer->pid, peer->uid,
                 refusal);
    SendConnectionError(sock.get(), absl::ResourceExhaustedError(refusal));
    return;
  }
  std::shared_ptr<ServedSession> session =
      factory_(next_id_.fetch_add(1), std::move(sock), *peer);
  absl::MutexLock lock(&mu_);
  RunSession(std::move(session), std::move(charge));
}

bool SessionServer::Serve(std::shared_ptr<ServedSession> session, uid_t uid) {
  absl::MutexLock lock(&mu_);
  if (stopping_.load()) return false;
  // Counted, never refused: its executor serves it already (over its
  // uid's limit it runs uncharged).
  absl::StatusOr<UidAccount::Charge> c =
      account_->Take(uid, UidResource::kSessions, 1);
  live_sessions_.fetch_add(1);
  RunSession(std::move(session), c.ok() ? *std::move(c) : UidAccount::Charge());
  return true;
}

absl::Status SessionServer::IsASession(uint64_t id) {
  absl::MutexLock lock(&mu_);
  for (Slot& slot : slots_) {
    if (slot.session->id() != id || !slot.counted) continue;
    KREG_ASSIGN_OR_RETURN(
        UidAccount::Charge c,
        account_->Take(slot.session->peer().uid, UidResource::kSessions, 1));
    slot.charge = std::move(c);  // gives the pending connection back
    return absl::OkStatus();
  }
  return absl::OkStatus();
}

void SessionServer::NotASession(uint64_t id) {
  absl::MutexLock lock(&mu_);
  for (Slot& slot : slots_) {
    if (slot.session->id() != id || !slot.counted) continue;
    slot.counted = false;
    slot.charge.Release();
    live_sessions_.fetch_sub(1);
    return;
  }
}

void SessionServer::RunSession(std::shared_ptr<ServedSession> session,
                               UidAccount::Charge charge) {
  slots_.emplace_back();
  Slot* slot = &slots_.back();
  slot->session = std::move(session);
  slot->charge = std::move(charge);
  parker_.Run([this, slot](ConnectionParker::Wake why) { Advance(slot, why); });
}

void SessionServer::Advance(Slot* slot, ConnectionParker::Wake why) {
  const NextStep next = slot->session->Step(why);
  if (next.done()) {
    Finish(slot);
    return;
  }
  parker_.Park(slot->session->id(), next.fd, next.deadline,
               [this, slot](ConnectionParker::Wake w) { Advance(slot, w); });
}

void SessionServer::Finish(Slot* slot) {
  parker_.Forget(slot->session->id());
  spdlog::info("session {} (pid {}) closed", slot->session->id(),
               slot->session->peer().pid);
  absl::MutexLock lock(&mu_);
  slot->charge.Release();
  if (slot->counted) live_sessions_.fetch_sub(1);
  slot->counted = false;
  slot->done = true;
}

void SessionServer::ReapFinished() {
  std::list<Slot> finished;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = slots_.begin(); it != slots_.end();) {
      auto next = std::next(it);
      if (it->done) finished.splice(finished.end(), slots_, it);
      it = next;
    }
  }
  finished.clear();  // releases sessions and arenas
}

void SessionServer::Stop() {
  if (stopping_.exchange(true)) return;
  if (wake_fd_.ok()) {
    uint64_t one = 1;
    if (::write(wake_fd_.get(), &one, sizeof(one)) < 0) {
      spdlog::warn("sessions: wake failed: {}", strerror(errno));
    }
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  std::list<Slot> all;
  {
    absl::MutexLock lock(&mu_);
    for (Slot& s : slots_) s.session->Shutdown();
  }
  // Waiting sessions take their last step now; running ones end as their
  // Shutdown makes them.
  parker_.StopParking();
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](std::list<Slot>* slots) {
          return std::all_of(slots->begin(), slots->end(),
                             [](const Slot& s) { return s.done; });
        },
        &slots_));
    all.splice(all.end(), slots_);
  }
  parker_.Join();
  all.clear();
  own_listener_.reset();  // removes the path unless a newer kregd took it
}

}  // namespace kreg
