#include "daemon/executor/ffi/thread_pool.h"

#include <spdlog/spdlog.h>

#include <exception>
#include <utility>

namespace kreg {
namespace ffi_internal {

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads < 1) num_threads = 1;
  workers_.reserve(num_threads);
  for (int i = 0; i < num_threads; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& worker : workers_) worker.join();
}

bool ThreadPool::Schedule(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  queue_.push_back(std::move(task));
  return true;
}

void ThreadPool::WorkerLoop() {
  auto has_work_or_stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !queue_.empty();
  };
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&has_work_or_stopping));
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      task();
    } catch (const std::exception& e) {
      spdlog::error("XLA FFI thread pool task threw an exception: {}",
                    e.what());
    } catch (...) {
      spdlog::error("XLA FFI thread pool task threw a non-standard exception");
    }
  }
}

}  // namespace ffi_internal
}  // namespace kreg
