// What a session needs from the rest of its executor process, and what a
// lookup of a target resolves to (docs/design.md §8): the seam between a
// session (session.h, the launch executors) and the executor that hosts it
// (executor_backend.h), faked in tests.
#ifndef KREGD_DAEMON_EXECUTOR_SESSION_BACKEND_H_
#define KREGD_DAEMON_EXECUTOR_SESSION_BACKEND_H_

#include <array>
#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/handler_spec.h"
#include "common/unique_fd.h"
#include "daemon/base/launch.h"
#include "daemon/base/types.h"
#include "daemon/executor/ffi/call_options.h"
#include "kreg/v1/session.pb.h"

namespace kreg {

class RepointTable;
class StateTable;

// A target's handler and the statistics row its calls count in: kregd's
// token for the target's generation in this executor (0: none).
struct ResolvedHandler {
  void* handler = nullptr;
  uint32_t token = 0;
  // The client's process registered the target (ResolveReply.holds_content,
  // DESIGN §14 rule 1): a re-point moves it only when it lists the session.
  bool content = false;
};

// A target's whole handler bundle (docs/kernel-author-guide.md, "Handler
// bundles and state"), by stage (null where the bundle has none), and its
// generation's stats token.
struct ResolvedBundle {
  std::array<void*, kNumHandlerStages> stages{};
  uint32_t token = 0;
};

// What a session needs from the rest of its process. Implemented by the
// executor's ExecutorBackend (daemon/executor/executor_backend.h: handlers from
// its module cache, run through FfiHost; local binds relayed to kregd),
// faked in tests. Thread-safe: every session thread calls it.
class SessionBackend {
 public:
  virtual ~SessionBackend() = default;
  // Local execution (DESIGN §11): the registered module of (name, platform)
  // as a sealed memfd (`*module`) for the client's own process, after every
  // registration rule and the site's local_execution policy.
  virtual absl::StatusOr<v1::BindLocalReply> BindLocal(
      const v1::BindLocal& /*request*/, UniqueFd* /*module*/) {
    return absl::UnimplementedError(
        "this session backend cannot hand out modules for local execution");
  }
  // The handler registered as `key` (with `generation` > 0: that pinned
  // generation's, docs/replace.md §7), or NOT_FOUND naming it.
  virtual absl::StatusOr<ResolvedHandler> Lookup(const TargetKey& key,
                                                 uint32_t generation) = 0;
  // The whole handler bundle registered as `key` now (with `generation` >
  // 0: that pinned generation's), asking kregd every time: a bundle's
  // instantiate stage runs the current generation (docs/replace.md,
  // "States across a replacement"). NOT_FOUND naming it.
  virtual absl::StatusOr<ResolvedBundle> LookupBundle(const TargetKey& /*key*/,
                                                      uint32_t /*generation*/) {
    return absl::UnimplementedError(
        "this session backend does not host handler bundles");
  }
  // The call-site states of the process's sessions (null: the session
  // keeps its own, bounded by SessionLimits::max_states_per_session), and
  // where a session's count of them is published (null: nowhere). Both
  // must outlive the session.
  virtual StateTable* States() { return nullptr; }
  // Charges one more call-site state to the client's uid (`delta` +1,
  // before the instantiate stage runs: RESOURCE_EXHAUSTED naming
  // max_states_per_uid) or gives one back (-1).
  virtual absl::Status ChargeState(int /*delta*/) { return absl::OkStatus(); }
  virtual std::atomic<uint64_t>* StateGauge() { return nullptr; }
  // Runs `handler` on `frame`; the handler's error verbatim.
  virtual absl::Status Execute(void* handler, const LaunchFrame& frame) = 0;
  // The same with platform resources (CUDA: the session stream and the
  // stream-ordered scratch allocator).
  virtual absl::Status ExecuteWith(void* handler, const LaunchFrame& frame,
                                   const CallOptions& /*options*/) {
    return Execute(handler, frame);
  }
  virtual uint32_t ffi_api_major() const = 0;
  virtual uint32_t ffi_api_minor() const = 0;
  // Around every handler call of a launch: the request's id, target and
  // the token of the handler's generation (an executor records them where
  // kregd can read them if it dies), then whether the handler succeeded (an
  // executor counts the call and its latency in the token's row).
  virtual void BeginLaunch(uint64_t /*request_id*/, const TargetKey& /*key*/,
                           uint32_t /*token*/) {}
  virtual void EndLaunch(bool /*ok*/) {}
  // The session's arena now has `bytes` (0 once released).
  virtual void ArenaSized(uint64_t /*bytes*/) {}
  // After each reply: true asks the session to end (the executor is being
  // recycled, e.g. after a sticky CUDA error).
  virtual bool ShouldStop() { return false; }
  // The request just handled needed kregd, which is gone (it stopped or
  // died; DESIGN §12): the session ends without answering, so the client
  // retries on a new session, with the next kregd.
  virtual bool LostDaemon() const { return false; }
  // The targets kregd re-pointed in this executor (docs/replace.md); null:
  // none ever are. Must outlive the session.
  virtual const RepointTable* Repoints() const { return nullptr; }
};

}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_SESSION_BACKEND_H_
