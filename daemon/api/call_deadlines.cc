#include "daemon/api/call_deadlines.h"

namespace kreg {

CallDeadlines::CallDeadlines() : thread_([this] { Run(); }) {}

CallDeadlines::~CallDeadlines() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    changed_.Signal();
  }
  thread_.join();
}

CallDeadlines::Watch::~Watch() {
  absl::MutexLock lock(&owner_->mu_);
  owner_->calls_.erase(key_);
}

CallDeadlines::Watch CallDeadlines::Cancel(grpc::ServerContext* ctx,
                                           absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  std::pair<absl::Time, uint64_t> key(deadline, next_id_++);
  calls_.emplace(key, ctx);
  changed_.Signal();
  return Watch(this, key);
}

void CallDeadlines::Run() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    // Under mu_: a watched call's handler has not returned yet.
    while (!calls_.empty() && calls_.begin()->first.first <= absl::Now()) {
      calls_.begin()->second->TryCancel();
      calls_.erase(calls_.begin());
    }
    changed_.WaitWithDeadline(&mu_, calls_.empty()
                                        ? absl::InfiniteFuture()
                                        : calls_.begin()->first.first);
  }
}

}  // namespace kreg
