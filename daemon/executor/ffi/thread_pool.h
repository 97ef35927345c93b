// The daemon-wide worker pool behind XLA_FFI_ThreadPool_Schedule.
#ifndef KREGD_DAEMON_EXECUTOR_FFI_THREAD_POOL_H_
#define KREGD_DAEMON_EXECUTOR_FFI_THREAD_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace kreg {
namespace ffi_internal {

// A fixed set of worker threads running queued tasks in FIFO order.
// Thread-safe. The destructor stops accepting tasks, runs every task already
// queued (handlers' futures may depend on them), then joins the workers.
// Exceptions escaping a task are logged and swallowed.
class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);  // num_threads >= 1
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Queues `task`; false (task dropped) once the pool is shutting down.
  bool Schedule(std::function<void()> task);

  int num_threads() const { return static_cast<int>(workers_.size()); }

 private:
  void WorkerLoop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;  // written only by the constructor
};

}  // namespace ffi_internal
}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_FFI_THREAD_POOL_H_
