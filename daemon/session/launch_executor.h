// Inside one session, what runs the launches of one platform (DESIGN §3, §8):
// the session itself is transport (socket frames, the launch ring), Hello
// and the arena; it hands each Launch to the LaunchExecutor of the launch's
// platform. Not to be confused with the executor *processes* (kregd-exec,
// daemon/exec/) in which whole sessions run.
#ifndef KREGD_DAEMON_SESSION_LAUNCH_EXECUTOR_H_
#define KREGD_DAEMON_SESSION_LAUNCH_EXECUTOR_H_

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "common/wire.h"
#include "daemon/types.h"
#include "kreg/v1/session.pb.h"

namespace kreg {

class SessionBackend;
class ShmArena;

// The handlers a session has resolved (registrations are never changed, and
// a retired name cannot be retired while a session has it bound).
class HandlerTable {
 public:
  explicit HandlerTable(SessionBackend* backend) : backend_(backend) {}
  // The handler registered as `key` (asking the backend the first time),
  // or the backend's NOT_FOUND naming it.
  absl::StatusOr<void*> Lookup(const TargetKey& key);
  void Clear() { handlers_.clear(); }

 private:
  SessionBackend* const backend_;
  std::map<TargetKey, void*> handlers_;
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
};

// Runs one platform's launches of one session. Called with the session's
// request lock held (one request at a time).
class LaunchExecutor {
 public:
  virtual ~LaunchExecutor() = default;

  // One Launch request of this platform and its attached descriptors.
  // `reply` may carry platform details on failure too (CUDA: a mapping the
  // client must send again, a doorbell already signalled).
  virtual absl::Status Launch(uint64_t request_id, const v1::Launch& launch,
                              std::vector<UniqueFd> fds,
                              v1::LaunchReply* reply) = 0;
  // What this platform adds to the HelloReply.
  virtual void DescribeTo(v1::HelloReply* reply) const { (void)reply; }
  // The session ends: waits for the platform's outstanding work and
  // releases what it holds.
  virtual void Release() {}
};

}  // namespace kreg

#endif  // KREGD_DAEMON_SESSION_LAUNCH_EXECUTOR_H_
