// Deadlines kregd sets on gRPC calls itself (a client may set none): one
// thread cancels each watched call still running at its deadline, so that
// a stalled stream cannot hold a handler thread and what it has read.
#ifndef KREGD_DAEMON_API_CALL_DEADLINES_H_
#define KREGD_DAEMON_API_CALL_DEADLINES_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <map>
#include <thread>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kreg {

class CallDeadlines {
 public:
  CallDeadlines();
  ~CallDeadlines();  // stops the thread
  CallDeadlines(const CallDeadlines&) = delete;
  CallDeadlines& operator=(const CallDeadlines&) = delete;

  // Cancels (ServerContext::TryCancel) the call of `ctx` at `deadline`
  // unless the returned watch is destroyed first, as the handler must
  // before it returns.
  class Watch {
   public:
    Watch(CallDeadlines* owner, std::pair<absl::Time, uint64_t> key)
        : owner_(owner), key_(key) {}
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

   private:
    CallDeadlines* const owner_;
    const std::pair<absl::Time, uint64_t> key_;
  };
  Watch Cancel(grpc::ServerContext* ctx, absl::Time deadline);

 private:
  void Run();

  absl::Mutex mu_;
  absl::CondVar changed_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::pair<absl::Time, uint64_t>, grpc::ServerContext*> calls_
      ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_API_CALL_DEADLINES_H_
