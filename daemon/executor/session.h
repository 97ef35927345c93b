// One client session as an executor serves it (DESIGN §3, §8): the Unix
// socket connection kregd handed over, its shared-memory arena, the request
// loop and the launch executors that call handlers. Only kregd-exec (and
// tests) link this; kregd sees sessions through served_session.h.
#ifndef KREGD_DAEMON_EXECUTOR_SESSION_H_
#define KREGD_DAEMON_EXECUTOR_SESSION_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/stage_trace.h"
#include "common/unique_fd.h"
#include "common/wire.h"
#include "daemon/base/launch.h"
#include "daemon/base/protocol_version.h"
#include "daemon/base/served_session.h"
#include "daemon/base/types.h"
#include "daemon/executor/ffi/ffi_host.h"
#include "daemon/executor/launch_executor.h"
#include "daemon/executor/ring_decoder.h"
#include "daemon/executor/session_backend.h"
#include "daemon/executor/shm_arena.h"
#include "daemon/executor/state_table.h"
#include "kreg/v1/session.pb.h"

namespace kreg {

class CudaDevices;
class LaunchRing;
class RepointTable;

struct SessionLimits {
  uint64_t max_arena_bytes = 4ull << 30;
  uint64_t max_message_bytes = 64ull << 20;
  // Largest module a registration may upload.
  uint64_t max_module_bytes = 512ull << 20;
  // Call-site states (handler bundles) one session may hold; 0: unbounded.
  uint64_t max_states_per_session = 4096;
  // After a reply, busy-poll this long for the next request before blocking
  // (saves the wake-up latency of back-to-back calls; costs CPU).
  int64_t spin_us = 0;
  // A connection that has not said Hello within this time is closed with
  // an error (0: no deadline).
  int64_t hello_timeout_ms = 0;
  // The launch ring (DESIGN §9): offered at Hello when true; its thread
  // spins this long for the next descriptor before it sleeps on the futex.
  // kregd's config keys launch_ring and ring_spin_us (ExecInit) set them.
  bool launch_ring = true;
  int64_t ring_spin_us = 50;
  // What the receive buffers of all sessions of this process may hold at
  // once (max_buffered_bytes; shared, must outlive them). Null: unbounded.
  wire::ByteBudget* receive_budget = nullptr;
};

// Serves one connection until the peer closes it or Shutdown() is called;
// the destructor releases the arena and the socket. The session is the
// transport (socket frames and the launch ring), Hello and the arena; each
// Launch goes to the LaunchExecutor of its platform (platform_executors.h:
// CpuExecutor, CudaExecutor), which also owns that platform's state and
// requests (the CUDA one is created on the first CUDA request and released
// when the connection ends).
// Run() is called on one thread; Shutdown() from any. Once the client set up
// a launch ring, a second thread serves it; it and Run() handle one request
// at a time (mu_), and Run() stops and joins it before it releases anything.
// `backend`, `counters` and `cuda` (null: no CUDA launches) must outlive it.
class Session final : public ServedSession {
 public:
  Session(uint64_t id, UniqueFd sock, const PeerCred& peer,
          const SessionLimits& limits, SessionBackend* backend,
          SessionCounters* counters, CudaDevices* cuda = nullptr);
  ~Session() override;
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // The request loop. Returns when the connection ends.
  void Run() override;
  // Makes a blocked Run() return (shuts the socket down).
  void Shutdown() override;

  // Handles one decoded request with its attached descriptors (owned).
  // Exposed for tests; Run() calls it for every frame.
  v1::SessionResponse Handle(const v1::SessionRequest& request,
                             std::vector<UniqueFd> fds);
  // The descriptor the last Handle() attaches to its response (BindLocal's
  // module memfd), taken; Run() sends it with the response.
  UniqueFd TakeReplyFd() { return std::move(reply_fd_); }

  uint64_t id() const override { return id_; }
  const PeerCred& peer() const override { return peer_; }
  // The call-site states this session holds (offered with it to a new
  // kregd, which charges them to the uid again).
  uint64_t StatesHeld() const { return states_->HeldBy(id_); }

 private:
  // Run's parts. The next frame into `buffer` and `fds`: before Hello all
  // of it by `hello_deadline`; after Hello (with a hello_timeout) all of
  // it within hello_timeout_ms of its first byte, after any wait for that
  // byte. wire's result.
  int NextFrame(uint32_t max_bytes, wire::Clock::time_point hello_deadline,
                bool before_hello, wire::RecvBuffer* buffer,
                std::vector<int>* fds);
  // Why a frame could not be taken (`rc`, not kOk or kEof), said in the
  // log (rate-limited per uid) and to the client where it can act on it.
  void SayFrameRefused(int rc, bool before_hello);
  absl::Status DoHello(const v1::Hello& hello, v1::HelloReply* reply);
  absl::Status DoArenaGrow(const v1::ArenaGrow& grow, std::vector<UniqueFd> fds,
                           v1::ArenaGrowReply* r);
  absl::Status DoLaunch(const v1::Launch& launch, std::vector<UniqueFd> fds,
                        v1::LaunchReply* reply);
  // A handler bundle's instantiate stage for one call site (session.proto
  // Instantiate): the state it made is kept in states_ under the returned
  // handle; the limit is checked before the handler runs.
  absl::Status DoInstantiate(const v1::Instantiate& request,
                             v1::InstantiateReply* reply);
  // A handler bundle's prepare or initialize stage for one execution of a
  // call site (session.proto StageCall): runs the stage of the bundle that
  // made the call site's state, with that state.
  absl::Status DoStageCall(const v1::StageCall& request);
  // Maps the ring region (the one fd) and starts the ring thread.
  absl::Status DoRingSetup(const v1::RingSetup& setup,
                           std::vector<UniqueFd> fds);
  // The ring thread: takes descriptors until the ring stops or breaks.
  void RingLoop();
  // One descriptor taken off the ring, validated and run (mu_ held).
  // `*flags` gets the completion's flags (CUDA). `*end_session` is set when
  // an asynchronous CUDA launch could not signal its doorbell: the
  // client's stream waits for it, so the session must end (the client
  // then releases that wait itself).
  // `times` receives the stage stamps of a traced launch
  // (ring::kSubmitTrace: stage::Current() then points at it until the
  // completion is published).
  absl::Status RunRingLaunch(const std::string& descriptor, uint64_t* tag,
                             uint32_t* flags, bool* end_session,
                             stage::Times* times);
  // Stops the ring thread and waits for it (the launch in progress ends
  // first), then unmaps the ring.
  void StopRing();

  const uint64_t id_;
  UniqueFd sock_;
  const PeerCred peer_;
  const SessionLimits limits_;
  SessionBackend* const backend_;
  SessionCounters* const counters_;
  bool hello_done_ = false;
  uint64_t request_id_ = 0;  // of the request being handled
  UniqueFd reply_fd_;        // attached to the response being built
  ShmArena arena_;
  HandlerTable handlers_;
  std::unique_ptr<StateTable> own_states_;  // when the backend has none
  StateTable* const states_;
  // One per platform, at its Platform's index (MakeLaunchExecutors).
  std::vector<std::unique_ptr<LaunchExecutor>> executors_;
  // Held while a request or a ring launch is handled.
  std::mutex mu_;
  std::unique_ptr<LaunchRing> ring_;
  std::thread ring_thread_;
  std::atomic<bool> ring_exited_{false};
  RingDecoder ring_decoder_;  // used under mu_ (ring and socket launches)
};

}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_SESSION_H_
