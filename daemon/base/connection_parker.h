// Connections that wait hold no thread (docs/design.md §6: a door a uid
// holds idle must not cost kregd a thread per connection). A served
// connection runs in steps on a small, elastic pool of worker threads (16
// start at once; more only while work waits 5 ms with none idle, so steps
// that block for long cannot starve the others);
// between steps it is parked here, on one epoll thread, until its socket
// has new bytes (or is closed) or its deadline passes. So thousands of
// idle sessions, control and watch connections cost descriptors, not
// threads, and a half frame costs nothing while it waits (edge-triggered:
// only new bytes wake it).
//
//   ConnectionParker parker;
//   parker.Start();
//   parker.Run([&](ConnectionParker::Wake why) { ... step ...
//     parker.Park(id, fd, deadline, next_step); });
//   ...
//   parker.StopParking();  // parked steps run with kStopping, and new ones
//   ...                    // wait for the connections to finish
//   parker.Join();
//
// Thread-safe.
#ifndef KREGD_DAEMON_BASE_CONNECTION_PARKER_H_
#define KREGD_DAEMON_BASE_CONNECTION_PARKER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"

namespace kreg {

class ConnectionParker {
 public:
  // Why a step runs: first, its socket has news (bytes, or the peer
  // closed), its deadline passed, or the parker is stopping.
  enum class Wake { kStart, kReadable, kTimedOut, kStopping };
  using Step = std::function<void(Wake)>;

  // Idle workers beyond the first few exit after this long.
  explicit ConnectionParker(absl::Duration worker_idle = absl::Seconds(5));
  ~ConnectionParker();  // StopParking() and Join()
  ConnectionParker(const ConnectionParker&) = delete;
  ConnectionParker& operator=(const ConnectionParker&) = delete;

  // Creates the epoll instance and starts its thread; INTERNAL on failure.
  absl::Status Start();

  // Runs `step` on a worker thread with kStart.
  void Run(Step step);
  // Runs `step` on a worker once `fd` has bytes that arrived since the
  // connection `key` last parked (or that were there when `fd` was first
  // parked), or its peer closed (kReadable), or at `deadline` (kTimedOut);
  // at once with kStopping after StopParking. `fd` stays the caller's (the
  // parker watches a duplicate of it until Forget or a Park with another
  // fd). One parked step per key at a time.
  void Park(uint64_t key, int fd, absl::Time deadline, Step step);
  // Stops watching `key` (its connection ended). Its parked step, if any,
  // is dropped.
  void Forget(uint64_t key);

  // Every parked step runs now with kStopping, and so does every later
  // Park. The caller then waits for its connections to end.
  void StopParking();
  // Stops the epoll thread and joins every worker once their steps are
  // done. Idempotent.
  void Join();

  // Threads that run steps now (busy or idle): for tests and metrics.
  size_t workers();
  // Connections parked or watched now.
  size_t watched();

 private:
  struct Watch {
    UniqueFd dup;  // what epoll watches (a duplicate of the caller's fd)
    int fd = -1;   // the caller's fd number it duplicates
    bool parked = false;
    bool news = false;  // an event came while no step was parked
    absl::Time deadline = absl::InfiniteFuture();
    Step step;
  };
  void EpollLoop();
  // Queues `work` for a worker, starting one when none is idle.
  void Dispatch(std::function<void()> work) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DispatchStep(Step step, Wake why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WorkerLoop();
  void StartWorker() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Work has waited too long with no worker idle to take it.
  bool Starved(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unpark(uint64_t key, Watch* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Nudge() const;  // wakes the epoll thread
  void JoinFinished();

  const absl::Duration worker_idle_;
  UniqueFd epoll_;
  UniqueFd wake_;  // eventfd: wakes the epoll thread
  std::thread epoll_thread_;

  absl::Mutex mu_;
  absl::CondVar cv_;  // a worker may take work from queue_
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // StopParking was called
  bool joining_ ABSL_GUARDED_BY(mu_) = false;   // Join was called
  std::map<uint64_t, Watch> watches_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<absl::Time, uint64_t>> deadlines_ ABSL_GUARDED_BY(mu_);
  struct Queued {
    std::function<void()> work;
    absl::Time queued;
  };
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  size_t idle_workers_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::thread::id, std::thread> workers_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread::id> finished_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kreg

#endif  // KREGD_DAEMON_BASE_CONNECTION_PARKER_H_
