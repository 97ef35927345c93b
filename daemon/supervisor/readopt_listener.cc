#include "daemon/supervisor/readopt_listener.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/wire.h"
#include "daemon/base/files.h"
#include "daemon/base/log_limit.h"
#include "daemon/base/served_session.h"
#include "daemon/base/validate.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

bool IsUnixStream(int fd) {
  int domain = 0;
  int type = 0;
  socklen_t n = sizeof(domain);
  if (::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &n) != 0) return false;
  n = sizeof(type);
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &n) != 0) return false;
  return domain == AF_UNIX && type == SOCK_STREAM;
}

// One frame of at most kMaxReadoptFrameBytes by `deadline`.
absl::Status ReadFrame(int conn, std::chrono::steady_clock::time_point deadline,
                       std::string* payload, std::vector<UniqueFd>* fds) {
  wire::RecvBuffer buffer;
  std::vector<int> raw;
  const int rc =
      wire::RecvFrame(conn, kMaxReadoptFrameBytes, &buffer, &raw, deadline);
  fds->clear();
  for (int fd : raw) fds->emplace_back(fd);
  if (rc == wire::kTimedOut) {
    return absl::DeadlineExceededError(
        absl::StrCat("the offer did not arrive whole within ",
                     ReadoptListener::kOfferDeadline.count(), " s"));
  }
  if (rc != wire::kOk) {
    return absl::InvalidArgumentError(
        absl::StrCat("reading the offer: ", wire::ResultText(rc)));
  }
  *payload = std::move(buffer.payload());
  return absl::OkStatus();
}

// False when the executor cannot be told (it went away).
bool Reply(int conn, const absl::Status& status, bool drain) {
  v1::ExecReadoptReply reply;
  ToWireStatus(status, reply.mutable_status());
  reply.set_drain(drain);
  return wire::SendMessage(conn, reply) == wire::kOk;
}

// The handshake after an executor's first frame (`header`, which came
// with `fds`): kregd's proof of the executor's key and kregd's challenge
// go out, the executor's ExecReadoptProof comes back with its status page
// (then in `fds`). The executor's proof, to be judged; INVALID_ARGUMENT
// naming what is wrong.
absl::StatusOr<std::string> Handshake(
    int conn, const v1::ExecReadopt& header, const std::string& secret,
    const std::string& challenge,
    std::chrono::steady_clock::time_point deadline,
    std::vector<UniqueFd>* fds) {
  if (header.challenge().size() != kSupervisionChallengeBytes ||
      !fds->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the offer's challenge has ", header.challenge().size(),
                     " bytes and ", fds->size(), " descriptors came with it (",
                     kSupervisionChallengeBytes, " bytes and none expected)"));
  }
  v1::ExecReadoptReply reply;
  reply.set_proof(
      KregdProof(AdoptionKey(secret, IdentityOf(header)), header.challenge()));
  reply.set_challenge(challenge);
  if (wire::SendMessage(conn, reply) != wire::kOk) {
    return absl::InvalidArgumentError(
        "the executor went away before kregd's challenge reached it");
  }
  std::string payload;
  KREG_RETURN_IF_ERROR(ReadFrame(conn, deadline, &payload, fds));
  v1::ExecReadoptProof proof;
  if (!proof.ParseFromString(payload)) {
    return absl::InvalidArgumentError(
        "the answer to kregd's challenge does not parse as "
        "kreg.v1.ExecReadoptProof");
  }
  return proof.proof();
}

}  // namespace

absl::StatusOr<ReadoptOffer> ReadOfferSessions(
    int conn, v1::ExecReadopt header, std::vector<UniqueFd> page_fds,
    std::chrono::steady_clock::time_point deadline, uint64_t max_states) {
  if (page_fds.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the offer carries ", page_fds.size(),
                     " descriptors, not one (its status page)"));
  }
  ReadoptOffer offer;
  KREG_ASSIGN_OR_RETURN(StatusPage page,
                        StatusPage::Map(std::move(page_fds[0]), header.slots(),
                                        /*require_seals=*/true));
  offer.page.emplace(std::move(page));
  std::vector<bool> taken(header.slots(), false);
  for (uint32_t i = 0; i < header.sessions(); ++i) {
    std::string payload;
    std::vector<UniqueFd> fds;
    KREG_RETURN_IF_ERROR(ReadFrame(conn, deadline, &payload, &fds));
    v1::ExecReadoptSession rs;
    if (!rs.ParseFromString(payload)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "offered session ", i, " does not parse as ExecReadoptSession"));
    }
    if (fds.size() != 2 || !IsUnixStream(fds[0].get()) ||
        !IsUnixStream(fds[1].get())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "offered session ", i,
          " does not carry exactly two Unix stream sockets (the client's "
          "and the new broker's)"));
    }
    if (rs.slot() >= header.slots() || taken[rs.slot()]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "offered session ", i, " claims slot ", rs.slot(), ", out of range (",
          header.slots(), " slots) or claimed twice"));
    }
    taken[rs.slot()] = true;
    if (rs.tokens_size() > kMaxReadoptTokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("offered session ", i, " lists ", rs.tokens_size(),
                       " targets (at most ", kMaxReadoptTokens, ")"));
    }
    ReadoptOffer::Session s;
    absl::StatusOr<PeerCred> peer = PeerCredOf(fds[0].get());
    if (!peer.ok() || peer->pid <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("offered session ", i,
                       ": the client's socket has no peer credentials"));
    }
    s.peer = *peer;
    s.session_id = rs.session_id();
    s.slot = rs.slot();
    if (max_states != 0 && rs.states() > max_states) {
      // Before kregd charges them to the uid (max_states_per_uid).
      return absl::InvalidArgumentError(
          absl::StrCat("offered session ", i, " claims ", rs.states(),
                       " call-site states, more than max_states_per_session (",
                       max_states, ")"));
    }
    s.states = rs.states();
    for (const v1::ResolvedToken& t : rs.tokens()) {
      if (absl::Status v = ValidateTargetName(t.name()); !v.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "offered session ", i, " lists a bad target: ", v.message()));
      }
      absl::StatusOr<Platform> p = ParsePlatform(t.platform());
      if (!p.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("offered session ", i,
                         " lists a bad target: ", p.status().message()));
      }
      s.tokens.emplace_back(TargetKey{t.name(), *p}, t.token());
    }
    s.client = std::move(fds[0]);
    s.broker = std::move(fds[1]);
    offer.sessions.push_back(std::move(s));
  }
  offer.header = std::move(header);
  return offer;
}

ReadoptListener::ReadoptListener(std::string path, AdoptionPolicy policy,
                                 ReadoptHandler handler)
    : path_(std::move(path)),
      policy_(std::move(policy)),
      handler_(std::move(handler)) {}

ReadoptListener::~ReadoptListener() { Stop(); }

absl::Status ReadoptListener::Start() {
  KREG_ASSIGN_OR_RETURN(UnixListener l,
                        UnixListener::Bind(path_, 0666, static_cast<gid_t>(-1),
                                           "supervision socket"));
  listener_ = std::make_unique<UnixListener>(std::move(l));
  wake_fd_.reset(::eventfd(0, EFD_CLOEXEC));
  if (!wake_fd_.ok()) {
    return ErrnoError("eventfd");
  }
  thread_ = std::thread([this] { AcceptLoop(); });
  spdlog::info(
      "supervision: executors left by an earlier kregd offer "
      "themselves on {}",
      path_);
  return absl::OkStatus();
}

void ReadoptListener::Stop() {
  if (stopping_.exchange(true)) return;
  if (wake_fd_.ok()) {
    uint64_t one = 1;
    (void)!::write(wake_fd_.get(), &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
  Reap(/*all=*/true);
  listener_.reset();
}

void ReadoptListener::Reap(bool all) {
  std::list<Worker> finished;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = workers_.begin(); it != workers_.end();) {
      if (all && !it->done) ::shutdown(it->fd, SHUT_RDWR);
      if (all || it->done) {
        auto next = std::next(it);
        finished.splice(finished.end(), workers_, it);
        it = next;
      } else {
        ++it;
      }
    }
  }
  for (Worker& w : finished) w.thread.join();
}

void ReadoptListener::AcceptLoop() {
  std::chrono::milliseconds pause(0);
  while (!stopping_.load()) {
    // While paused (out of descriptors) only the wake-up is watched.
    pollfd fds[2] = {{pause.count() > 0 ? -1 : listener_->fd(), POLLIN, 0},
                     {wake_fd_.get(), POLLIN, 0}};
    int ready = ::poll(fds, 2, pause.count() > 0 ? pause.count() : -1);
    pause = std::chrono::milliseconds(0);
    if (ready < 0) {
      if (errno == EINTR) continue;
      spdlog::error("supervision: poll failed: {}", strerror(errno));
      return;
    }
    if (fds[1].revents != 0 || stopping_.load()) return;
    Reap(/*all=*/false);
    if ((fds[0].revents & POLLIN) == 0) continue;
    UniqueFd conn(::accept4(listener_->fd(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn.ok()) {
      pause = AcceptFailed("supervision socket", errno);
      continue;
    }
    absl::StatusOr<PeerCred> peer = PeerCredOf(conn.get());
    if (!peer.ok()) continue;
    absl::MutexLock lock(&mu_);
    int total = 0;
    int of_uid = 0;
    for (const Worker& w : workers_) {
      if (w.done) continue;
      ++total;
      of_uid += w.uid == peer->uid;
    }
    if (total >= kMaxOffers || of_uid >= kMaxOffersPerUid) {
      refused_.fetch_add(1);
      std::string more;
      if (PeerLogLimiter().Allow(absl::StrCat("supervision uid ", peer->uid),
                                 &more)) {
        spdlog::warn(
            "supervision: closing a connection of pid {} (uid {}): {} offers "
            "are being read ({} of that uid; at most {}, {} per uid){}",
            peer->pid, peer->uid, total, of_uid, kMaxOffers, kMaxOffersPerUid,
            more);
      }
      continue;
    }
    workers_.emplace_back();
    Worker* w = &workers_.back();
    // Open until the worker is marked done, so that Stop() never shuts
    // down a descriptor number that was reused meanwhile.
    auto guard =
        std::make_shared<UniqueFd>(::fcntl(conn.get(), F_DUPFD_CLOEXEC, 0));
    w->fd = guard->get();
    w->uid = peer->uid;
    w->thread = std::thread([this, w, guard, c = std::move(conn)]() mutable {
      Serve(std::move(c));
      absl::MutexLock lock(&mu_);
      w->done = true;
    });
  }
}

void ReadoptListener::Serve(UniqueFd conn) {
  const auto deadline = std::chrono::steady_clock::now() + kOfferDeadline;
  absl::StatusOr<PeerCred> peer = PeerCredOf(conn.get());
  if (!peer.ok()) return;
  auto refuse = [&](const absl::Status& why, bool drain) {
    refused_.fetch_add(1);
    std::string more;
    if (PeerLogLimiter().Allow(absl::StrCat("supervision uid ", peer->uid),
                               &more)) {
      spdlog::warn("supervision: {} the offer of pid {} (uid {}): {}{}",
                   drain ? "draining the executor of" : "refused", peer->pid,
                   peer->uid, std::string(why.message()), more);
    }
    Reply(conn.get(), why, drain);
  };
  std::string payload;
  std::vector<UniqueFd> fds;
  if (absl::Status s = ReadFrame(conn.get(), deadline, &payload, &fds);
      !s.ok()) {
    refuse(s, false);
    return;
  }
  v1::ExecReadopt header;
  if (!header.ParseFromString(payload)) {
    refuse(absl::InvalidArgumentError(
               "the offer does not parse as kreg.v1.ExecReadopt"),
           false);
    return;
  }
  // The executor proves its key by answering kregd's challenge.
  if (OfferJudgement j = CheckClaims(header, *peer, policy_);
      j.verdict != OfferVerdict::kAdopt) {
    refuse(absl::PermissionDeniedError(j.why), false);
    return;
  }
  std::string challenge(kSupervisionChallengeBytes, '\0');
  if (::getrandom(challenge.data(), challenge.size(), 0) !=
      static_cast<ssize_t>(challenge.size())) {
    refuse(ErrnoError("getrandom for a challenge"), false);
    return;
  }
  absl::StatusOr<std::string> proof =
      Handshake(conn.get(), header, policy_.secret, challenge, deadline, &fds);
  if (!proof.ok()) {
    refuse(proof.status(), false);
    return;
  }
  const OfferJudgement j =
      JudgeOffer(header, *peer, policy_, challenge, *proof);
  if (j.verdict != OfferVerdict::kAdopt) {
    const bool drain = j.verdict == OfferVerdict::kDrain;
    refuse(drain ? absl::FailedPreconditionError(j.why)
                 : absl::PermissionDeniedError(j.why),
           drain);
    return;
  }
  absl::StatusOr<ReadoptOffer> offer =
      ReadOfferSessions(conn.get(), std::move(header), std::move(fds), deadline,
                        policy_.max_states_per_session);
  if (!offer.ok()) {
    refuse(offer.status(), false);
    return;
  }
  // The handler keeps the connection as the executor's control socket;
  // the OK goes out before kregd may send it anything else.
  UniqueFd keep(::fcntl(conn.get(), F_DUPFD_CLOEXEC, 0));
  offer->control = std::move(conn);
  bool confirmed = false;
  auto confirm = [&] {
    confirmed = true;
    return Reply(keep.get(), absl::OkStatus(), /*drain=*/false);
  };
  absl::Status s = handler_(*std::move(offer), confirm);
  if (!s.ok() && !confirmed) {
    const bool drain = s.code() == absl::StatusCode::kFailedPrecondition;
    refused_.fetch_add(1);
    spdlog::warn("supervision: {} the executor of pid {} (uid {}): {}",
                 drain ? "draining" : "refused", peer->pid, peer->uid,
                 std::string(s.message()));
    Reply(keep.get(), s, drain);
    return;
  }
  if (s.ok()) adopted_.fetch_add(1);
}

}  // namespace kreg
