#include "daemon/executor/session.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/ring_layout.h"
#include "common/status_macros.h"
#include "common/wire.h"
#include "daemon/base/log_limit.h"
#include "daemon/base/validate.h"
#include "daemon/executor/launch_ring.h"
#include "daemon/executor/platform_executors.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

// Gives a call-site state's charge back to its uid (the broker's
// ChargeState(-1)); when kregd cannot be told, the broker keeps the charge
// until the session ends.
void GiveBackState(SessionBackend* backend, uint64_t session) {
  if (absl::Status s = backend->ChargeState(-1); !s.ok()) {
    spdlog::warn(
        "session {}: a released state stays charged to its uid until the "
        "session ends: {}",
        session, std::string(s.message()));
  }
}

}  // namespace

Session::Session(uint64_t id, UniqueFd sock, const PeerCred& peer,
                 const SessionLimits& limits, SessionBackend* backend,
                 SessionCounters* counters, CudaDevices* cuda)
    : id_(id),
      sock_(std::move(sock)),
      peer_(peer),
      limits_(limits),
      backend_(backend),
      counters_(counters),
      arena_(limits.max_arena_bytes),
      handlers_(backend, id),
      own_states_(
          backend->States() != nullptr
              ? nullptr
              : std::make_unique<StateTable>(limits.max_states_per_session)),
      states_(backend->States() != nullptr ? backend->States()
                                           : own_states_.get()),
      executors_(MakeLaunchExecutors({id, peer, backend, &arena_, &handlers_,
                                      limits.receive_budget, cuda, states_})),
      ring_decoder_(limits.receive_budget) {}

Session::~Session() {
  StopRing();
  states_->ReleaseSession(id_);
}

void Session::Shutdown() { ::shutdown(sock_.get(), SHUT_RDWR); }

int Session::NextFrame(uint32_t max_bytes,
                       wire::Clock::time_point hello_deadline,
                       bool before_hello, wire::RecvBuffer* buffer,
                       std::vector<int>* fds) {
  if (before_hello) {
    return wire::RecvFrame(sock_.get(), max_bytes, buffer, fds, hello_deadline);
  }
  wire::SpinUntilReadable(sock_.get(), limits_.spin_us);
  if (limits_.hello_timeout_ms <= 0) {
    return wire::RecvFrame(sock_.get(), max_bytes, buffer, fds);
  }
  pollfd p{sock_.get(), POLLIN, 0};
  while (::poll(&p, 1, -1) < 0 && errno == EINTR) {
  }
  return wire::RecvFrame(
      sock_.get(), max_bytes, buffer, fds,
      wire::Clock::now() + std::chrono::milliseconds(limits_.hello_timeout_ms));
}

void Session::SayFrameRefused(int rc, bool before_hello) {
  const int64_t ms = limits_.hello_timeout_ms;
  std::string why;    // for the log, after "session <id> "
  absl::Status tell;  // for the client; OK: nothing it can act on
  if (rc == wire::kTimedOut && before_hello) {
    why = absl::StrCat("(pid ", peer_.pid, " uid ", peer_.uid,
                       "): no Hello within ", ms, " ms; closing");
    tell = absl::DeadlineExceededError(
        absl::StrCat("kregd closed this session: no Hello within ", ms,
                     " ms of connecting"));
  } else if (rc == wire::kTimedOut) {
    why = absl::StrCat("(pid ", peer_.pid, " uid ", peer_.uid,
                       "): a message did not arrive whole within ", ms,
                       " ms of its first byte; closing");
    tell = absl::DeadlineExceededError(absl::StrCat(
        "kregd closed this session: a message did not arrive whole "
        "within ",
        ms, " ms of its first byte (hello_timeout_s)"));
  } else {
    why = absl::StrCat("(uid ", peer_.uid, " pid ", peer_.pid,
                       "): closing: ", wire::ResultText(rc));
  }
  if (rc == wire::kOverBudget) {
    const wire::ByteBudget& budget = *limits_.receive_budget;
    tell = absl::ResourceExhaustedError(absl::StrCat(
        "session message refused: it would take the bytes buffered "
        "for messages in flight by every session of this executor "
        "(uid ",
        peer_.uid, ") past ", budget.limit(), " (max_buffered_bytes; ",
        budget.used(),
        " in use); send fewer large messages at once (modules go by "
        "fd, tensors through the arena) or ask the operator to raise "
        "max_buffered_bytes"));
  }
  if (rc == wire::kTooLarge || rc == wire::kTooManyFds) {
    tell = absl::ResourceExhaustedError(
        absl::StrCat("session message refused: ", wire::ResultText(rc),
                     " (max_message_bytes ", limits_.max_message_bytes,
                     ", at most ", wire::kMaxFdsPerFrame, " fds)"));
  }
  std::string more;
  if (PeerLogLimiter().Allow(absl::StrCat("uid ", peer_.uid), &more)) {
    spdlog::info("session {} {}{}", id_, why, more);
  }
  if (!tell.ok()) SendConnectionError(sock_.get(), tell);
}

void Session::Run() {
  uint32_t max_bytes = static_cast<uint32_t>(
      std::min<uint64_t>(limits_.max_message_bytes, UINT32_MAX));
  // A buffer above this is given back after its frame (large frames are
  // rare: module bytes and tensors travel in fds and the arena).
  constexpr size_t kKeepBytes = 1 << 20;
  wire::RecvBuffer buffer(limits_.receive_budget);
  std::string out;
  // Until Hello, every byte of every frame must arrive within
  // hello_timeout_ms of connecting: half a frame cannot hold the connection.
  const wire::Clock::time_point hello_deadline =
      wire::Clock::now() + std::chrono::milliseconds(limits_.hello_timeout_ms);
  // After Hello a session may idle between messages as long as it likes,
  // but a message that has begun must arrive whole within
  // hello_timeout_ms of its first byte, and a reply the client does not
  // read within that time ends the session: a peer that stalls mid-frame
  // or stops reading cannot hold a session thread and its buffers.
  if (limits_.hello_timeout_ms > 0) {
    timeval tv{};
    tv.tv_sec = limits_.hello_timeout_ms / 1000;
    tv.tv_usec = (limits_.hello_timeout_ms % 1000) * 1000;
    ::setsockopt(sock_.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  }
  for (;;) {
    const bool before_hello = !hello_done_ && limits_.hello_timeout_ms > 0;
    std::vector<int> raw_fds;
    int rc =
        NextFrame(max_bytes, hello_deadline, before_hello, &buffer, &raw_fds);
    if (rc == wire::kEof) break;
    if (rc != wire::kOk) {
      SayFrameRefused(rc, before_hello);
      break;
    }
    std::vector<UniqueFd> fds;
    for (int fd : raw_fds) fds.emplace_back(fd);
    v1::SessionRequest request;
    v1::SessionResponse resp;
    const std::string& payload = buffer.payload();
    if (!request.ParseFromString(payload)) {
      ToWireStatus(absl::InvalidArgumentError(absl::StrCat(
                       "malformed session request (", payload.size(),
                       " bytes do not parse as kreg.v1.SessionRequest)")),
                   resp.mutable_status());
    } else {
      buffer.Shrink(kKeepBytes);  // parsed: the bytes are in `request`
      std::lock_guard<std::mutex> lock(mu_);
      resp = Handle(request, std::move(fds));
    }
    buffer.Shrink(kKeepBytes);
    if (backend_->LostDaemon()) {
      spdlog::info(
          "session {} (pid {}): kregd is gone; ending the session so that "
          "the client retries with the next kregd",
          id_, peer_.pid);
      break;
    }
    resp.SerializeToString(&out);
    UniqueFd attach = TakeReplyFd();
    int attach_fds[1] = {attach.get()};
    rc = wire::SendFrame(sock_.get(), out.data(), out.size(), attach_fds,
                         attach.ok() ? 1 : 0);
    attach.reset();
    if (rc != wire::kOk) {
      spdlog::info("session {} (pid {}): reply failed: {}", id_, peer_.pid,
                   wire::ResultText(rc));
      break;
    }
    if (backend_->ShouldStop()) break;
  }
  // Release now, not when the session object is reaped: the peer sees EOF
  // and the arena's memory goes back at once.
  ::shutdown(sock_.get(), SHUT_RDWR);
  StopRing();
  // Waits for the session's GPU work, then releases its stream, mappings,
  // events and scratch.
  for (auto& executor : executors_) executor->Release();
  arena_.Reset();
  backend_->ArenaSized(0);
  handlers_.Clear();
}

v1::SessionResponse Session::Handle(const v1::SessionRequest& request,
                                    std::vector<UniqueFd> fds) {
  v1::SessionResponse resp;
  resp.set_id(request.id());
  request_id_ = request.id();
  reply_fd_.reset();
  absl::Status status;
  if (!fds.empty() && request.body_case() != v1::SessionRequest::kArenaGrow &&
      request.body_case() != v1::SessionRequest::kLaunch &&
      request.body_case() != v1::SessionRequest::kCudaShare &&
      request.body_case() != v1::SessionRequest::kCudaDoorbell &&
      request.body_case() != v1::SessionRequest::kRingSetup) {
    status = absl::InvalidArgumentError(absl::StrCat(
        fds.size(),
        " unexpected file descriptor(s) attached to a request "
        "other than ArenaGrow, Launch, CudaShare, CudaDoorbellSetup or "
        "RingSetup"));
  } else if (request.body_case() == v1::SessionRequest::kHello) {
    status = DoHello(request.hello(), resp.mutable_hello());
  } else if (!hello_done_) {
    status = absl::FailedPreconditionError(
        "the first request of a session must be Hello");
  } else {
    switch (request.body_case()) {
      case v1::SessionRequest::kRegisterTarget:
      case v1::SessionRequest::kList:
      case v1::SessionRequest::kControlHello:
        status = absl::FailedPreconditionError(
            "register_target, list and control_hello are not served in a "
            "session: send them on a control connection (a connection to "
            "the session socket whose first request is not hello), which "
            "kregd serves itself");
        break;
      case v1::SessionRequest::kBindLocal: {
        UniqueFd module;
        absl::StatusOr<v1::BindLocalReply> r =
            backend_->BindLocal(request.bind_local(), &module);
        if (r.ok() && !module.ok()) {
          r = absl::InternalError(
              "kregd answered BindLocal without the module's memfd");
        }
        if (r.ok()) {
          *resp.mutable_bind_local() = *std::move(r);
          reply_fd_ = std::move(module);
        } else {
          status = r.status();
        }
        break;
      }
      case v1::SessionRequest::kArenaGrow:
        status = DoArenaGrow(request.arena_grow(), std::move(fds),
                             resp.mutable_arena_grow());
        break;
      case v1::SessionRequest::kLaunch: {
        v1::LaunchReply reply;
        status = DoLaunch(request.launch(), std::move(fds), &reply);
        if (status.ok() || reply.cuda_mapping_missing() ||
            reply.doorbell_signalled()) {
          *resp.mutable_launch() = reply;
        }
        break;
      }
      case v1::SessionRequest::kRingSetup:
        status = DoRingSetup(request.ring_setup(), std::move(fds));
        if (status.ok()) resp.mutable_ring_setup();
        break;
      case v1::SessionRequest::kInstantiate:
        status =
            DoInstantiate(request.instantiate(), resp.mutable_instantiate());
        break;
      case v1::SessionRequest::kStageCall:
        status = DoStageCall(request.stage_call());
        if (status.ok()) resp.mutable_stage_call();
        break;
      case v1::SessionRequest::kReleaseState:
        status = states_->Release(request.release_state().state(), peer_.pid);
        if (status.ok()) resp.mutable_release_state();
        break;
      default: {
        // A platform's own requests (CudaShare, CudaDoorbellSetup).
        bool handled = false;
        for (auto& executor : executors_) {
          handled = executor->HandleRequest(request, &fds, &resp, &status);
          if (handled) break;
        }
        if (!handled) {
          status = absl::InvalidArgumentError(
              absl::StrCat("unknown session request kind ",
                           static_cast<int>(request.body_case())));
        }
      }
    }
  }
  ToWireStatus(status, resp.mutable_status());
  return resp;
}

absl::Status Session::DoHello(const v1::Hello& hello, v1::HelloReply* reply) {
  if (hello_done_) {
    return absl::FailedPreconditionError("Hello was already sent");
  }
  uint32_t minor = 0;
  std::string refusal;
  if (!NegotiateSessionProtocol(
          {kSessionProtocolMajor, kSessionProtocolMinor},
          {hello.protocol_major(), hello.protocol_minor()}, &minor, &refusal)) {
    return absl::FailedPreconditionError(refusal);
  }
  hello_done_ = true;
  spdlog::info(
      "session {}: uid {} gid {} pid {} (says pid {}), FFI {}.{}, session "
      "protocol {}.{}",
      id_, peer_.uid, peer_.gid, peer_.pid, hello.pid(), hello.ffi_api_major(),
      hello.ffi_api_minor(), kSessionProtocolMajor, minor);
  reply->set_session_id(id_);
  reply->set_protocol_major(kSessionProtocolMajor);
  reply->set_protocol_minor(kSessionProtocolMinor);
  reply->set_ffi_api_major(backend_->ffi_api_major());
  reply->set_ffi_api_minor(backend_->ffi_api_minor());
  reply->set_max_arena_bytes(limits_.max_arena_bytes);
  reply->set_max_message_bytes(limits_.max_message_bytes);
  reply->set_max_module_bytes(limits_.max_module_bytes);
  if (limits_.launch_ring) reply->set_launch_ring(ring::kVersion);
  for (const auto& executor : executors_) {
    executor->DescribeTo(reply);
  }
  return absl::OkStatus();
}

absl::Status Session::DoArenaGrow(const v1::ArenaGrow& grow,
                                  std::vector<UniqueFd> fds,
                                  v1::ArenaGrowReply* reply) {
  if (fds.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ArenaGrow needs exactly one memfd attached, got ", fds.size()));
  }
  KREG_RETURN_IF_ERROR(arena_.Replace(std::move(fds[0]), grow.size()));
  reply->set_size(arena_.size());
  backend_->ArenaSized(arena_.size());
  return absl::OkStatus();
}

absl::Status Session::DoLaunch(const v1::Launch& launch,
                               std::vector<UniqueFd> fds,
                               v1::LaunchReply* reply) {
  counters_->launches.fetch_add(1, std::memory_order_relaxed);
  const std::string& descriptor = launch.descriptor();
  uint64_t tag = 0;  // not used: the request id names a socket launch
  absl::StatusOr<RingLaunchHeader> header = ring_decoder_.Header(
      descriptor.data(), descriptor.size(), std::nullopt, &tag);
  absl::Status status = header.status();
  if (header.ok()) {
    LaunchExecutor::SocketPart socket{&launch, std::move(fds), reply};
    LaunchExecutor::Request request{request_id_, &*header,
                                    [&](const CudaBufferResolver* resolve) {
                                      return ring_decoder_.Decode(
                                          descriptor.data(), descriptor.size(),
                                          std::nullopt, arena_, &tag, resolve);
                                    },
                                    &socket};
    status =
        executors_[static_cast<size_t>(header->platform)]->Launch(&request);
  }
  if (!status.ok()) {
    counters_->launch_errors.fetch_add(1, std::memory_order_relaxed);
  }
  return status;
}

absl::Status Session::DoInstantiate(const v1::Instantiate& request,
                                    v1::InstantiateReply* reply) {
  const std::string& descriptor = request.descriptor();
  uint64_t tag = 0;
  // A descriptor without buffers: the CUDA resolver is never asked.
  const CudaBufferResolver no_buffers =
      [](const CudaRefView&, uint64_t, uint64_t,
         const std::string&) -> absl::StatusOr<void*> {
    return absl::InvalidArgumentError("an Instantiate carries no buffers");
  };
  absl::StatusOr<DecodedLaunch*> decoded =
      ring_decoder_.Decode(descriptor.data(), descriptor.size(), std::nullopt,
                           arena_, &tag, &no_buffers);
  if (!decoded.ok()) return decoded.status();
  const DecodedLaunch& d = **decoded;
  if (!d.frame.args.empty() || !d.frame.rets.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the Instantiate of \"", d.key.name, "\" carries ", d.frame.args.size(),
        " argument(s) and ", d.frame.rets.size(),
        " result(s); the instantiate stage takes attributes only"));
  }
  if (absl::Status room = states_->CheckRoom(id_); !room.ok()) return room;
  KREG_ASSIGN_OR_RETURN(ResolvedBundle bundle,
                        backend_->LookupBundle(d.key, d.generation));
  void* instantiate = bundle.stages[kInstantiate];
  if (instantiate != nullptr) {
    if (absl::Status charged = backend_->ChargeState(1); !charged.ok()) {
      return charged;
    }
  } else {
    return absl::FailedPreconditionError(absl::StrCat(
        "target \"", d.key.name, "\" (", PlatformName(d.key.platform),
        ") has no instantiate stage; register it as a handler bundle with "
        "one (docs/kernel-author-guide.md, \"Handler bundles and state\")"));
  }
  HostedState made;
  CallOptions options;
  options.stage = XLA_FFI_ExecutionStage_INSTANTIATE;
  options.state_out = &made;
  backend_->BeginLaunch(request_id_, d.key, bundle.token);
  absl::Status status = backend_->ExecuteWith(instantiate, d.frame, options);
  backend_->EndLaunch(status.ok());
  if (!status.ok()) {
    DestroyState(made);
    GiveBackState(backend_, id_);
    return status;
  }
  SessionBackend* backend = backend_;
  absl::StatusOr<uint64_t> handle = states_->Add(
      id_, peer_.pid, made, StateOwner{d.key, bundle.stages, bundle.token},
      backend_->StateGauge(),
      [backend, id = id_] { GiveBackState(backend, id); });
  if (!handle.ok()) {
    GiveBackState(backend_, id_);
    return handle.status();
  }
  reply->set_state(*handle);
  return absl::OkStatus();
}

absl::Status Session::DoStageCall(const v1::StageCall& request) {
  const uint32_t stage = request.stage();
  if (stage != XLA_FFI_ExecutionStage_PREPARE &&
      stage != XLA_FFI_ExecutionStage_INITIALIZE) {
    return absl::InvalidArgumentError(
        absl::StrCat("a StageCall runs stage ", XLA_FFI_ExecutionStage_PREPARE,
                     " (prepare) or ", XLA_FFI_ExecutionStage_INITIALIZE,
                     " (initialize), not ", stage,
                     " (instantiate is an Instantiate, execute a launch)"));
  }
  const HandlerStage which =
      stage == XLA_FFI_ExecutionStage_PREPARE ? kPrepare : kInitialize;
  const std::string& descriptor = request.descriptor();
  uint64_t tag = 0;
  absl::StatusOr<DecodedLaunch*> decoded = ring_decoder_.Decode(
      descriptor.data(), descriptor.size(), std::nullopt, arena_, &tag,
      /*cuda=*/nullptr, /*shapes_only=*/true);
  if (!decoded.ok()) return decoded.status();
  const DecodedLaunch& d = **decoded;
  // The stage of the bundle that made the call site's state (as its
  // launches: docs/replace.md, "States across a replacement"), or of the
  // current (or pinned) generation when the bundle keeps no state.
  CallOptions options;
  options.stage = static_cast<XLA_FFI_ExecutionStage>(stage);
  void* handler = nullptr;
  uint32_t token = 0;
  if (d.state != 0) {
    KREG_ASSIGN_OR_RETURN(StateTable::Entry held,
                          states_->Get(d.state, peer_.pid, d.key));
    options.state = held.state;
    handler = held.owner.stages[which];
    token = held.owner.token;
  } else {
    KREG_ASSIGN_OR_RETURN(ResolvedBundle bundle,
                          backend_->LookupBundle(d.key, d.generation));
    handler = bundle.stages[which];
    token = bundle.token;
  }
  if (handler == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "target \"", d.key.name, "\" (", PlatformName(d.key.platform),
        ") has no ", HandlerStageName(which),
        " stage; its forwarding handler was registered with one (was the "
        "target replaced by a bundle without it? bind it again)"));
  }
  backend_->BeginLaunch(request_id_, d.key, token);
  absl::Status status = backend_->ExecuteWith(handler, d.frame, options);
  backend_->EndLaunch(status.ok());
  return status;
}

}  // namespace kreg
