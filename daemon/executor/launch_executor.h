// Inside one session, what runs the launches of one platform (DESIGN §3, §8):
// the session itself is transport (socket frames, the launch ring), Hello
// and the arena; it hands each launch (socket or ring: one descriptor
// format) to the LaunchExecutor of the launch's platform. Not to be confused
// with the executor *processes* (kregd-exec, daemon/executor/) in which whole
// sessions run.
#ifndef KREGD_DAEMON_EXECUTOR_LAUNCH_EXECUTOR_H_
#define KREGD_DAEMON_EXECUTOR_LAUNCH_EXECUTOR_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/handler_spec.h"
#include "common/unique_fd.h"
#include "common/wire.h"
#include "daemon/base/types.h"
#include "daemon/executor/launch_fields.h"
#include "daemon/executor/ring_decoder.h"
#include "daemon/executor/session_backend.h"
#include "kreg/v1/session.pb.h"

namespace kreg {

class CudaDevices;
class RepointTable;
class ShmArena;
class StateTable;

// The handlers a session has resolved (a retired name cannot be retired
// while a session has it bound). A target kregd re-points
// (docs/replace.md) switches at the next Lookup: the start of a launch.
class HandlerTable {
 public:
  // `session_id`: kregd's id of the session (ExecRepoint.content_sessions).
  explicit HandlerTable(SessionBackend* backend, uint64_t session_id = 0);
  // The handler registered as `key` and its stats token (asking the
  // backend the first time, then the backend's RepointTable when it
  // changed), or the backend's NOT_FOUND naming it. With `generation` > 0
  // (pinned, docs/replace.md §7) that generation's, asked once and never
  // re-pointed. A handler held for its content switches only with a
  // re-point that names this session.
  absl::StatusOr<ResolvedHandler> Lookup(const TargetKey& key,
                                         uint32_t generation = 0);
  void Clear() { handlers_.clear(); }

 private:
  SessionBackend* const backend_;
  const uint64_t session_id_;
  const RepointTable* const repoints_;  // null: targets are never re-pointed
  uint64_t seen_epoch_ = 0;
  std::map<std::pair<TargetKey, uint32_t>, ResolvedHandler> handlers_;
};

// What a session lends the executors of its platforms; all outlive them.
struct SessionContext {
  uint64_t id = 0;
  PeerCred peer;
  SessionBackend* backend = nullptr;
  ShmArena* arena = nullptr;
  HandlerTable* handlers = nullptr;
  // What the platform's launch caches are charged to (max_buffered_bytes;
  // null: unbounded).
  wire::ByteBudget* budget = nullptr;
  // The executor process's CUDA devices (null: started without CUDA).
  CudaDevices* cuda = nullptr;
  // The session's call-site states (handler bundles).
  StateTable* states = nullptr;
};

// Runs one platform's launches of one session. Called with the session's
// request lock held (one request at a time).
class LaunchExecutor {
 public:
  virtual ~LaunchExecutor() = default;

  // Decodes the rest of a launch's descriptor (RingDecoder::Decode); a
  // platform whose buffers are device memory passes its resolver.
  using RingDecode = std::function<absl::StatusOr<DecodedLaunch*>(
      const CudaBufferResolver* resolve)>;
  // What a socket Launch request brings besides its descriptor.
  struct SocketPart {
    const v1::Launch* launch = nullptr;  // side data: CUDA shares, events...
    std::vector<UniqueFd> fds;           // the request's attached descriptors
    // May carry platform details on failure too (CUDA: a mapping the client
    // must send again, a doorbell already signalled).
    v1::LaunchReply* reply = nullptr;
  };
  // One launch of this platform, from the session socket or off the launch
  // ring (DESIGN §9): one descriptor format, its header already checked.
  struct Request {
    uint64_t id = 0;  // the socket's request id; on the ring the tag
    const RingLaunchHeader* header = nullptr;
    RingDecode decode;             // decodes the rest of the descriptor
    SocketPart* socket = nullptr;  // null: taken off the launch ring
    // Out, ring only: the completion's ring::k* flags, and whether the
    // session must end after the completion (CUDA: the doorbell of a failed
    // asynchronous launch could not be signalled).
    uint32_t flags = 0;
    bool end_session = false;
  };
  // Runs `*request` (setting its out fields): the decoder's or the
  // handler's error.
  virtual absl::Status Launch(Request* request) = 0;
  // The platform's own session requests (CUDA: CudaShare,
  // CudaDoorbellSetup). False when `request` is none of them; true when it
  // was handled, with its reply part set in `*resp` or its error in
  // `*status`; `*fds` are the descriptors attached to it.
  virtual bool HandleRequest(const v1::SessionRequest& /*request*/,
                             std::vector<UniqueFd>* /*fds*/,
                             v1::SessionResponse* /*resp*/,
                             absl::Status* /*status*/) {
    return false;
  }
  // What this platform adds to the HelloReply.
  virtual void DescribeTo(v1::HelloReply* /*reply*/) const {}
  // The session ends: waits for the platform's outstanding work and
  // releases what it holds.
  virtual void Release() {}
};

}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_LAUNCH_EXECUTOR_H_
