#include "daemon/supervisor/broker.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/generations.h"
#include "common/status_macros.h"
#include "common/wire.h"
#include "daemon/base/broker_limits.h"
#include "daemon/base/log_limit.h"
#include "daemon/base/served_session.h"
#include "daemon/base/validate.h"
#include "daemon/registry/registration_mapper.h"
#include "daemon/registry/registry.h"
#include "daemon/registry/runnable.h"
#include "daemon/store/module_store.h"
#include "daemon/supervisor/local_module_cache.h"
#include "daemon/supervisor/local_repointer.h"
#include "kreg/v1/registry.pb.h"
#include "spdlog/spdlog.h"

namespace kreg {

// The field name of a session request's body (the protos are lite: no
// descriptors).
std::string SessionRequestName(v1::SessionRequest::BodyCase body) {
  switch (body) {
    case v1::SessionRequest::kHello:
      return "hello";
    case v1::SessionRequest::kControlHello:
      return "control_hello";
    case v1::SessionRequest::kRegisterTarget:
      return "register_target";
    case v1::SessionRequest::kList:
      return "list";
    case v1::SessionRequest::kArenaGrow:
      return "arena_grow";
    case v1::SessionRequest::kLaunch:
      return "launch";
    case v1::SessionRequest::kCudaShare:
      return "cuda_share";
    case v1::SessionRequest::kCudaDoorbell:
      return "cuda_doorbell";
    case v1::SessionRequest::kRingSetup:
      return "ring_setup";
    case v1::SessionRequest::kBindLocal:
      return "bind_local";
    case v1::SessionRequest::kWatch:
      return "watch";
    case v1::SessionRequest::kRepointAck:
      return "repoint_ack";
    default:
      return absl::StrCat("empty or unknown (", static_cast<int>(body), ")");
  }
}

absl::StatusOr<v1::RepointAck> ReadRepointAck(const std::string& payload,
                                              size_t num_fds) {
  if (num_fds != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kregd closed this watch connection: a repoint_ack carries no file "
        "descriptor, and ",
        num_fds, " came with it"));
  }
  v1::SessionRequest req;
  if (!req.ParseFromString(payload)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kregd closed this watch connection: malformed request (",
        payload.size(), " bytes do not parse as kreg.v1.SessionRequest)"));
  }
  if (!req.has_repoint_ack()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "kregd closed this watch connection: it reads only repoint_ack "
        "there, not ",
        SessionRequestName(req.body_case()),
        "; send other requests on a control connection or a session"));
  }
  return req.repoint_ack();
}

SessionBroker::SessionBroker(uint64_t id, UniqueFd client, const PeerCred& peer,
                             const BrokerContext& ctx)
    : id_(id), client_(std::move(client)), peer_(peer), ctx_(ctx) {}

SessionBroker::SessionBroker(uint64_t id, UniqueFd client, const PeerCred& peer,
                             const BrokerContext& ctx,
                             ExecutorPool::Binding binding)
    : id_(id),
      client_(std::move(client)),
      peer_(peer),
      ctx_(ctx),
      binding_(std::move(binding)),
      broker_fd_(binding_.broker.get()),
      handed_over_(true) {
  phase_ = Phase::kSession;
}

SessionBroker::~SessionBroker() { ctx_.pool->Release(&binding_); }

void SessionBroker::Shutdown() {
  if (broker_fd_ >= 0) ::shutdown(broker_fd_, SHUT_RDWR);
  // An executor left running serves the client's connection on (kregd
  // only closes its copy).
  if (!handed_over_.load() || !ctx_.pool->leaving()) {
    ::shutdown(client_.get(), SHUT_RDWR);
  }
}

void SessionBroker::RefuseClient(const absl::Status& status) {
  SendConnectionError(client_.get(), status);
  ::shutdown(client_.get(), SHUT_RDWR);
}

bool SessionBroker::FirstIsHello(int rc, const std::string& first, bool has_fds,
                                 bool* control) {
  *control = false;
  v1::SessionRequest req;
  if (rc == wire::kOk &&
      (has_fds || !req.ParseFromString(first) || !req.has_hello())) {
    *control = true;  // whatever it is, the control step reads and answers it
    return false;
  }
  if (rc == wire::kOk) return true;
  std::string more;
  if ((rc == wire::kTimedOut || rc == wire::kTooLarge) &&
      PeerLogLimiter().Allow(absl::StrCat("uid ", peer_.uid), &more)) {
    spdlog::info("session {} (pid {} uid {}): first message: {}; closing{}",
                 id_, peer_.pid, peer_.uid, wire::ResultText(rc), more);
  }
  if (rc == wire::kTimedOut) {
    RefuseClient(absl::DeadlineExceededError(absl::StrCat(
        "kregd closed this connection: no whole request within ",
        ctx_.hello_timeout_ms,
        " ms of connecting (hello_timeout_s); send hello (a session) or a "
        "control_hello, register_target or list request (a control "
        "connection) at once")));
  } else if (rc == wire::kTooLarge) {
    RefuseClient(absl::ResourceExhaustedError(absl::StrCat(
        "kregd closed this connection: its first message is over ",
        kMaxControlRequestBytes,
        " bytes, more than a hello or a control request (register_target, "
        "list) may be; module bytes go as a sealed memfd")));
  }
  return false;
}

bool SessionBroker::AdmitControl() {
  if (ctx_.not_a_session) ctx_.not_a_session(id_);
  if (ctx_.account == nullptr) return true;
  absl::StatusOr<UidAccount::Charge> c =
      ctx_.account->Take(peer_.uid, UidResource::kControlConnections, 1);
  if (c.ok()) {
    control_charge_ = *std::move(c);
    return true;
  }
  std::string more;
  if (PeerLogLimiter().Allow(absl::StrCat("uid ", peer_.uid), &more)) {
    spdlog::warn(
        "session {} (pid {} uid {}): refusing a control connection: "
        "{}{}",
        id_, peer_.pid, peer_.uid, std::string(c.status().message()), more);
  }
  RefuseClient(absl::ResourceExhaustedError(absl::StrCat(
      "kregd refused this control connection: ", c.status().message())));
  return false;
}

absl::Duration SessionBroker::HelloTimeout() const {
  return absl::Milliseconds(ctx_.hello_timeout_ms);
}

NextStep SessionBroker::Step(ConnectionParker::Wake why) {
  switch (phase_) {
    case Phase::kFirst:
      return StepFirst(why);
    case Phase::kControl:
      return StepControl(why);
    case Phase::kWatch:
      return StepWatch(why);
    case Phase::kSession:
      return StepSession(why);
  }
  return NextStep::Done();
}

void SessionBroker::Run() {
  // One connection served on the caller's thread: waits as the session
  // server's parker does (edge-triggered, so a half frame costs nothing).
  UniqueFd ep(::epoll_create1(EPOLL_CLOEXEC));
  int watched = -1;
  ConnectionParker::Wake why = ConnectionParker::Wake::kStart;
  for (;;) {
    const NextStep next = Step(why);
    if (next.done()) return;
    if (next.fd != watched) {
      if (watched >= 0) ::epoll_ctl(ep.get(), EPOLL_CTL_DEL, watched, nullptr);
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
      if (::epoll_ctl(ep.get(), EPOLL_CTL_ADD, next.fd, &ev) != 0) {
        why = ConnectionParker::Wake::kStopping;
        watched = -1;
        continue;
      }
      watched = next.fd;
    }
    int timeout_ms = -1;
    if (next.deadline != absl::InfiniteFuture()) {
      timeout_ms = static_cast<int>(std::clamp<int64_t>(
          absl::ToInt64Milliseconds(
              absl::Ceil(next.deadline - absl::Now(), absl::Milliseconds(1))),
          0, 1 << 30));
    }
    epoll_event ev{};
    int ready;
    while ((ready = ::epoll_wait(ep.get(), &ev, 1, timeout_ms)) < 0 &&
           errno == EINTR) {
    }
    why = ready > 0 ? ConnectionParker::Wake::kReadable
                    : ConnectionParker::Wake::kTimedOut;
  }
}

NextStep SessionBroker::StepFirst(ConnectionParker::Wake why) {
  if (why == ConnectionParker::Wake::kStart) {
    first_deadline_ = absl::Now() + HelloTimeout();
  }
  if (why == ConnectionParker::Wake::kStopping) return NextStep::Done();
  std::string first;
  bool has_fds = false, partial = false;
  int rc = wire::TryPeekFrame(client_.get(), kMaxControlRequestBytes, &first,
                              &has_fds, &partial);
  if (rc == wire::kWouldBlock) {
    // The whole first message must be there within hello_timeout of
    // connecting; until then the connection waits without a thread.
    if (absl::Now() < first_deadline_) {
      return NextStep::WaitFor(client_.get(), first_deadline_);
    }
    rc = wire::kTimedOut;
  }
  bool control = false;
  if (!FirstIsHello(rc, first, has_fds, &control)) {
    if (control && AdmitControl()) {
      StartControl();
      return StepControl(ConnectionParker::Wake::kReadable);
    }
    control_charge_.Release();  // now, not when the server reaps this
    return NextStep::Done();
  }
  if (!BindExecutor()) return NextStep::Done();
  phase_ = Phase::kSession;
  return StepSession(ConnectionParker::Wake::kReadable);
}

bool SessionBroker::BindExecutor() {
  if (ctx_.is_a_session) {
    if (absl::Status s = ctx_.is_a_session(id_); !s.ok()) {
      std::string more;
      if (PeerLogLimiter().Allow(absl::StrCat("uid ", peer_.uid), &more)) {
        spdlog::warn("session {} (pid {} uid {}): refusing a session: {}{}",
                     id_, peer_.pid, peer_.uid, std::string(s.message()), more);
      }
      RefuseClient(s);
      return false;
    }
  }
  absl::StatusOr<ExecutorPool::Binding> b =
      ctx_.pool->Bind(id_, client_.get(), peer_);
  if (!b.ok()) {
    spdlog::warn("session {} (pid {} uid {}): {}", id_, peer_.pid, peer_.uid,
                 std::string(b.status().message()));
    RefuseClient(b.status());
    return false;
  }
  binding_ = *std::move(b);
  broker_fd_ = binding_.broker.get();
  handed_over_.store(true);
  return true;
}

void SessionBroker::StartControl() {
  spdlog::info("session {} (pid {} uid {}): control connection", id_, peer_.pid,
               peer_.uid);
  phase_ = Phase::kControl;
  // A reply the client does not read within hello_timeout ends it.
  timeval tv{};
  tv.tv_sec = ctx_.hello_timeout_ms / 1000;
  tv.tv_usec = (ctx_.hello_timeout_ms % 1000) * 1000;
  ::setsockopt(client_.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  last_request_ = absl::Now();
}

NextStep SessionBroker::EndControl() {
  ::shutdown(client_.get(), SHUT_RDWR);
  ForgetBindings();
  control_charge_.Release();
  return NextStep::Done();
}

int SessionBroker::NextRequest(uint32_t max_bytes, absl::Time idle_deadline,
                               NextStep* wait) {
  std::string peeked;
  bool has_fds = false, partial = false;
  const int rc =
      wire::TryPeekFrame(client_.get(), max_bytes, &peeked, &has_fds, &partial);
  const absl::Time now = absl::Now();
  if (rc != wire::kWouldBlock) {
    request_deadline_ = absl::InfiniteFuture();
    return rc;
  }
  if (partial) {
    // A request that has begun arrives whole within hello_timeout of its
    // first byte.
    if (request_deadline_ == absl::InfiniteFuture()) {
      request_deadline_ = now + HelloTimeout();
    }
    if (now >= request_deadline_) return wire::kTimedOut;
    *wait = NextStep::WaitFor(client_.get(), request_deadline_);
    return wire::kWouldBlock;
  }
  request_deadline_ = absl::InfiniteFuture();
  if (now >= idle_deadline) return kIdle;
  *wait = NextStep::WaitFor(client_.get(), idle_deadline);
  return wire::kWouldBlock;
}

NextStep SessionBroker::StepControl(ConnectionParker::Wake why) {
  if (why == ConnectionParker::Wake::kStopping) return EndControl();
  for (;;) {
    // Idle as long as the client likes while the connection holds a
    // registration (it is what keeps them); one that holds nothing is
    // closed after control_idle_timeout_s, so that idle connections cannot
    // hold the uid's slots.
    const absl::Time idle_deadline =
        holds_registrations_
            ? absl::InfiniteFuture()
            : last_request_ + absl::Milliseconds(ctx_.control_idle_timeout_ms);
    NextStep wait;
    int rc = NextRequest(kMaxControlRequestBytes, idle_deadline, &wait);
    if (rc == wire::kWouldBlock) return wait;
    if (rc == kIdle) {
      std::string more;
      if (PeerLogLimiter().Allow(absl::StrCat("uid ", peer_.uid), &more)) {
        spdlog::info(
            "session {} (pid {} uid {}): closing an idle control connection "
            "that holds no registration{}",
            id_, peer_.pid, peer_.uid, more);
      }
      RefuseClient(absl::DeadlineExceededError(absl::StrCat(
          "kregd closed this control connection: it held no registration and "
          "sent nothing for ",
          ctx_.control_idle_timeout_ms,
          " ms (control_idle_timeout_s); open a new one when there is "
          "something to send")));
      return EndControl();
    }
    std::vector<int> raw;
    if (rc == wire::kOk) {
      rc = wire::RecvFrame(
          client_.get(), kMaxControlRequestBytes, &control_buffer_, &raw,
          wire::Clock::now() +
              std::chrono::milliseconds(ctx_.hello_timeout_ms));
    }
    const std::string& payload = control_buffer_.payload();
    std::vector<UniqueFd> fds;
    for (int fd : raw) fds.emplace_back(fd);
    if (rc == wire::kEof) return EndControl();
    if (rc != wire::kOk) {
      std::string more;
      if (PeerLogLimiter().Allow(absl::StrCat("uid ", peer_.uid), &more)) {
        spdlog::info("session {} (pid {} uid {}): control connection: {}{}",
                     id_, peer_.pid, peer_.uid, wire::ResultText(rc), more);
      }
      RefuseClient(absl::ResourceExhaustedError(absl::StrCat(
          "kregd closed this control connection: ", wire::ResultText(rc),
          " (a request is at most ", kMaxControlRequestBytes, " bytes with ",
          "at most ", wire::kMaxFdsPerFrame,
          " file descriptors, and arrives whole within ", ctx_.hello_timeout_ms,
          " ms of its first byte)")));
      return EndControl();
    }
    v1::SessionRequest req;
    v1::SessionResponse resp;
    bool close = false;
    if (req.ParseFromString(payload)) {
      resp = ctx_.control(ctx_, id_, peer_, req, std::move(fds), &close);
    } else {
      close = true;
      resp.mutable_status()->set_code(
          static_cast<int>(absl::StatusCode::kInvalidArgument));
      resp.mutable_status()->set_message(absl::StrCat(
          "malformed request (", payload.size(),
          " bytes do not parse as kreg.v1.SessionRequest); closing this "
          "connection"));
    }
    if (resp.has_register_target() && resp.status().code() == 0) {
      holds_registrations_ = true;
    }
    if (wire::SendMessage(client_.get(), resp) != wire::kOk) {
      if (resp.has_watch()) ctx_.local_repointer->Detach(id_);
      return EndControl();
    }
    last_request_ = absl::Now();
    if (resp.has_watch()) {
      // A watch connection has its own per-uid cap (kMaxWatchesPerUid).
      control_charge_.Release();
      StartWatch();
      return StepWatch(ConnectionParker::Wake::kReadable);
    }
    if (close) return EndControl();
  }
}

void SessionBroker::StartWatch() {
  spdlog::info("session {} (pid {} uid {}): watch connection", id_, peer_.pid,
               peer_.uid);
  phase_ = Phase::kWatch;
  ctx_.local_repointer->Activate(
      id_, client_.get(),
      [this](const TargetKey& key) { return ctx_.registry->Lookup(key); },
      absl::Now() + HelloTimeout());
}

NextStep SessionBroker::StepWatch(ConnectionParker::Wake why) {
  LocalRepointer* repointer = ctx_.local_repointer;
  if (why == ConnectionParker::Wake::kStopping) {
    repointer->Detach(id_);
    return EndControl();
  }
  for (;;) {
    NextStep wait;
    int rc = NextRequest(kMaxRepointAckBytes, absl::InfiniteFuture(), &wait);
    if (rc == wire::kWouldBlock) return wait;
    std::vector<int> raw;
    if (rc == wire::kOk) {
      rc = wire::RecvFrame(
          client_.get(), kMaxRepointAckBytes, &control_buffer_, &raw,
          wire::Clock::now() +
              std::chrono::milliseconds(ctx_.hello_timeout_ms));
    }
    std::vector<UniqueFd> fds;
    for (int fd : raw) fds.emplace_back(fd);
    absl::Status refusal;
    if (rc == wire::kEof) {
      repointer->Detach(id_);
      return EndControl();
    }
    if (rc != wire::kOk) {
      refusal = absl::ResourceExhaustedError(absl::StrCat(
          "kregd closed this watch connection: ", wire::ResultText(rc),
          " (a repoint_ack is at most ", kMaxRepointAckBytes,
          " bytes and arrives whole within ", ctx_.hello_timeout_ms,
          " ms of its first byte)"));
    } else {
      absl::StatusOr<v1::RepointAck> ack =
          ReadRepointAck(control_buffer_.payload(), fds.size());
      if (ack.ok()) {
        repointer->Acked(id_, *ack);
        continue;
      }
      refusal = ack.status();
    }
    std::string more;
    if (PeerLogLimiter().Allow(absl::StrCat("uid ", peer_.uid), &more)) {
      spdlog::info("session {} (pid {} uid {}): {}{}", id_, peer_.pid,
                   peer_.uid, std::string(refusal.message()), more);
    }
    repointer->Detach(id_);
    RefuseClient(refusal);
    return EndControl();
  }
}

NextStep SessionBroker::StepSession(ConnectionParker::Wake why) {
  bool closed = false;
  bool refused = false;
  while (why != ConnectionParker::Wake::kStopping) {
    std::string peeked;
    bool has_fds = false, partial = false;
    int rc = wire::TryPeekFrame(broker_fd_, kMaxBrokerRequestBytes, &peeked,
                                &has_fds, &partial);
    // The executor's requests wait without a thread of kregd's.
    if (rc == wire::kWouldBlock) {
      return NextStep::WaitFor(broker_fd_, absl::InfiniteFuture());
    }
    std::vector<int> raw;
    // Never more than kMaxBrokerRequestBytes: the length is checked before
    // a byte of the payload is buffered.
    if (rc == wire::kOk) {
      rc = wire::RecvFrame(
          broker_fd_, kMaxBrokerRequestBytes, &session_buffer_, &raw,
          wire::Clock::now() +
              std::chrono::milliseconds(ctx_.hello_timeout_ms));
    }
    std::vector<UniqueFd> fds;
    for (int fd : raw) fds.emplace_back(fd);
    if (rc == wire::kTooLarge || rc == wire::kTooManyFds) {
      RefuseExecutorMessage(rc);
      refused = true;
      break;
    }
    if (rc != wire::kOk) break;
    v1::BrokerRequest req;
    if (!req.ParseFromString(session_buffer_.payload())) {
      spdlog::warn("session {}: malformed broker request from executor", id_);
      break;
    }
    if (req.body_case() == v1::BrokerRequest::kClosed) {
      closed = true;
      break;
    }
    UniqueFd fd;
    v1::BrokerReply reply = Handle(req, &fd);  // `fds` are closed
    int reply_fds[1] = {fd.get()};
    rc = wire::SendMessage(broker_fd_, reply, reply_fds, fd.ok() ? 1 : 0);
    if (rc != wire::kOk) break;
  }
  EndSession(closed, refused);
  return NextStep::Done();
}

void SessionBroker::EndSession(bool closed, bool refused) {
  if (!closed && !refused && ctx_.pool->leaving()) {
    // kregd is stopping and left the executor serving this session.
    ForgetBindings();
    ctx_.pool->Release(&binding_);
    binding_.broker.reset();
    broker_fd_ = -1;
    return;
  }
  if (!closed && !refused) {
    // A request the client sent and no executor read: the client is
    // waiting for its answer.
    int unread = 0;
    const bool pending =
        ::ioctl(client_.get(), FIONREAD, &unread) == 0 && unread > 0;
    absl::Status crash = ctx_.pool->AwaitCrash(&binding_, pending);
    if (!crash.ok()) RefuseClient(crash);
  }
  ::shutdown(client_.get(), SHUT_RDWR);
  ForgetBindings();
  ctx_.pool->Release(&binding_);
  binding_.broker.reset();
  broker_fd_ = -1;
}

void SessionBroker::ForgetBindings() {
  if (ctx_.bindings != nullptr) ctx_.bindings->RemoveSession(id_);
  if (ctx_.local_modules != nullptr) ctx_.local_modules->ReleaseSession(id_);
}

void SessionBroker::RefuseExecutorMessage(int result) {
  const pid_t exec_pid = ctx_.pool->CountRefusedBrokerMessage(binding_);
  std::string more;
  if (PeerLogLimiter().Allow(absl::StrCat("uid ", peer_.uid), &more)) {
    spdlog::warn(
        "session {} (pid {} uid {}): executor pid {} sent kregd a broker "
        "message it does not read ({}; at most {} bytes); ending the "
        "session{}",
        id_, peer_.pid, peer_.uid, exec_pid, wire::ResultText(result),
        kMaxBrokerRequestBytes, more);
  }
  RefuseClient(absl::ResourceExhaustedError(absl::StrCat(
      "kregd closed this session: its executor (pid ", exec_pid,
      ") sent kregd a message over the limit for executor messages (",
      kMaxBrokerRequestBytes, " bytes, at most ", wire::kMaxFdsPerFrame,
      " fds); a kernel running in that executor may be writing into its "
      "sockets")));
}

v1::BrokerReply SessionBroker::Handle(const v1::BrokerRequest& req,
                                      UniqueFd* fd_out) {
  v1::BrokerReply reply;
  absl::Status status;
  switch (req.body_case()) {
    case v1::BrokerRequest::kResolve: {
      absl::StatusOr<v1::ResolveReply> r = Resolve(req.resolve(), fd_out);
      if (r.ok()) {
        *reply.mutable_resolve() = *std::move(r);
      } else {
        status = r.status();
      }
      break;
    }
    case v1::BrokerRequest::kStateCharge:
      status = ChargeState(req.state_charge().delta());
      break;
    default:
      status = absl::InvalidArgumentError("unknown broker request");
  }
  ToWireStatus(status, reply.mutable_status());
  return reply;
}

void SessionBroker::KeepStates(uint64_t n) {
  if (ctx_.account == nullptr || n == 0) return;
  states_.reserve(states_.size() + n);
  for (uint64_t i = 0; i < n; ++i) {
    states_.push_back(ctx_.account->Keep(peer_.uid, UidResource::kStates, 1));
  }
}

absl::Status SessionBroker::ChargeState(int32_t delta) {
  if (delta == -1) {
    if (!states_.empty()) states_.pop_back();
    return absl::OkStatus();
  }
  if (delta != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a state charge of ", delta, " (only +1 or -1)"));
  }
  if (ctx_.account == nullptr) return absl::OkStatus();
  KREG_ASSIGN_OR_RETURN(UidAccount::Charge c,
                        ctx_.account->Take(peer_.uid, UidResource::kStates, 1));
  states_.push_back(std::move(c));
  return absl::OkStatus();
}

absl::StatusOr<EntryPtr> ResolveGeneration(const Registry& registry,
                                           const TargetKey& key,
                                           uint32_t generation) {
  EntryPtr e = registry.Lookup(key);
  if (e == nullptr && generation == 0) {
    return absl::NotFoundError(absl::StrCat(
        "target \"", key.name, "\" is not registered for platform ",
        PlatformName(key.platform), " in kregd"));
  }
  if (generation == 0 || (e != nullptr && generation == e->generation)) {
    return e;
  }
  std::vector<uint32_t> have;
  if (e != nullptr) {
    for (const Generation& g : e->generations) {
      if (g.generation == generation) {
        auto pinned = std::make_shared<TargetEntry>(*e);
        pinned->func_name = g.func_name;
        pinned->content_id = g.content_id;
        pinned->module_digest = g.module_digest;
        pinned->module_size = g.module_size;
        pinned->handler_info = g.handler_info;
        pinned->generation = g.generation;
        return EntryPtr(std::move(pinned));
      }
      have.push_back(g.generation);
    }
    if (have.empty()) have.push_back(e->generation);
  }
  return absl::NotFoundError(
      NoSuchGeneration(key.name, PlatformName(key.platform), generation, have));
}

absl::StatusOr<v1::ResolveReply> SessionBroker::Resolve(
    const v1::ResolveRequest& r, UniqueFd* fd_out) {
  KREG_RETURN_IF_ERROR(ValidateTargetName(r.target_name()));
  KREG_ASSIGN_OR_RETURN(Platform platform, ParsePlatform(r.platform()));
  TargetKey key{r.target_name(), platform};
  // DESIGN §14 rule 1: a process that registered the key runs the content
  // its registration matched, and moves on only with its own uid's or
  // root's replacements; one that binds by name follows the current one.
  const uint32_t registered = r.generation() == 0 && ctx_.bindings != nullptr
                                  ? ctx_.bindings->RegisteredBy(peer_.pid, key)
                                  : 0;
  const EntryPtr current = ctx_.registry->Lookup(key);
  uint32_t generation = r.generation();
  if (registered != 0 && current != nullptr) {
    SessionBindings::Bound held;
    held.registered = registered;
    generation = FollowedGeneration(*current, held, peer_.uid);
  }
  KREG_ASSIGN_OR_RETURN(EntryPtr e,
                        ResolveGeneration(*ctx_.registry, key, generation));
  if (r.local() && ctx_.local_modules == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat(
        "target \"", key.name, "\" (", PlatformName(key.platform),
        "): this kregd does not allow local execution (local_execution = "
        "\"deny\" in its configuration), so its kernels run only in its "
        "executors; run the target isolated (execution=\"isolated\", or "
        "unset KREG_EXECUTION) or ask the operator to allow local "
        "execution"));
  }
  if (e->kind == TargetKind::kInProcess) {
    return absl::FailedPreconditionError(absl::StrCat(
        "target \"", key.name, "\" is an in-process callable of pid ",
        e->registered_by.pid, "; it runs inside that process, not in kregd"));
  }
  if (!e->unavailable.empty()) {
    return absl::UnavailableError(absl::StrCat(
        "target \"", key.name, "\" is registered but its module could not ",
        "be loaded (", e->unavailable, "); re-register the original module ",
        "to repair it"));
  }
  if (std::optional<CrashRecord> q = ctx_.ledger->Quarantined(key, peer_.uid)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "target \"", key.name, "\" (", PlatformName(key.platform),
        ") is quarantined for uid ", peer_.uid, ": it crashed its executor ",
        q->crashes_in_window, " times within ", ctx_.ledger->policy().window_s,
        " s (last: ", q->last_reason,
        "). Fix the kernel and register it under a new name, or run "
        "`kregctl unquarantine ",
        key.name, " --platform ", PlatformName(key.platform), "`"));
  }
  if (r.local()) {
    absl::StatusOr<v1::ResolveReply> reply =
        ResolveLocal(key, e, r.generation() != 0, registered, fd_out);
    // As below: a replacement's LocalRepointer may have missed this holder.
    if (reply.ok() && ctx_.bindings != nullptr && r.generation() == 0 &&
        ctx_.registry->Lookup(key) != current) {
      return Resolve(r, fd_out);
    }
    return reply;
  }
  std::string path = ctx_.store->PathOf(e->module_digest);
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.ok()) {
    spdlog::error("opening store copy {}: {}", path, strerror(errno));
    return absl::UnavailableError(absl::StrCat(
        "the store copy of module ", e->module_digest, " of target \"",
        key.name, "\" cannot be opened; see kregd's log"));
  }
  v1::ResolveReply reply;
  reply.set_func_name(e->func_name);
  reply.set_module_digest(e->module_digest);
  reply.set_token(ctx_.pool->TokenFor(binding_, e));
  reply.set_holds_content(registered != 0);
  if (ctx_.bindings != nullptr) {
    ctx_.bindings->Add(id_, peer_, key, /*local=*/false, e->generation,
                       /*pinned=*/r.generation() != 0, registered);
    // A replacement committed since the Lookup may have listed the holders
    // before this one (docs/replace.md section 3): answer the new entry. A
    // pinned resolve keeps its generation.
    if (r.generation() == 0 && ctx_.registry->Lookup(key) != current) {
      return Resolve(r, fd_out);
    }
  }
  *fd_out = std::move(fd);
  return reply;
}

absl::StatusOr<v1::ResolveReply> SessionBroker::ResolveLocal(
    const TargetKey& key, const EntryPtr& e, bool pinned, uint32_t registered,
    UniqueFd* fd_out) {
  absl::StatusOr<UniqueFd> memfd =
      ctx_.local_modules->Open(e->module_digest, e->module_size, id_);
  if (!memfd.ok()) {
    return absl::Status(
        memfd.status().code(),
        absl::StrCat("target \"", key.name, "\" (", PlatformName(key.platform),
                     "): ", memfd.status().message()));
  }
  v1::ResolveReply reply;
  reply.set_func_name(e->func_name);
  reply.set_module_digest(e->module_digest);
  *reply.mutable_target() = DescribeTarget(*e, CudaLaunchStatus());
  reply.set_replaceable(ctx_.local_repointer != nullptr);
  *fd_out = *std::move(memfd);
  // A session may ask again: one hold, one count, one log line.
  if (ctx_.bindings != nullptr &&
      !ctx_.bindings->Add(id_, peer_, key, /*local=*/true, e->generation,
                          pinned, registered)) {
    return reply;
  }
  if (ctx_.local_binds != nullptr) ctx_.local_binds->fetch_add(1);
  std::string more;
  if (PeerLogLimiter().Allow(absl::StrCat("uid ", peer_.uid), &more)) {
    spdlog::info("session {} (pid {} uid {}): \"{}\" ({}) bound locally ({}){}",
                 id_, peer_.pid, peer_.uid, key.name,
                 PlatformName(key.platform), e->module_digest, more);
  }
  return reply;
}

}  // namespace kreg
