#include "daemon/base/connection_parker.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

constexpr uint64_t kWakeKey = std::numeric_limits<uint64_t>::max();
// Idle workers kept however long they wait.
constexpr size_t kKeepWorkers = 2;
// Workers started at once for work that waits; beyond them one more starts
// each kStarvedAfter while the oldest work waits and no worker is idle (the
// others are busy, or blocked in a long step), so a burst of connections
// does not start a thread each.
constexpr size_t kPromptWorkers = 16;
constexpr absl::Duration kStarvedAfter = absl::Milliseconds(5);

}  // namespace

ConnectionParker::ConnectionParker(absl::Duration worker_idle)
    : worker_idle_(worker_idle) {}

ConnectionParker::~ConnectionParker() {
  StopParking();
  Join();
}

absl::Status ConnectionParker::Start() {
  epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_.ok()) {
    return absl::InternalError(
        absl::StrCat("epoll_create1 failed: ", strerror(errno)));
  }
  wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_.ok()) {
    return absl::InternalError(
        absl::StrCat("eventfd failed: ", strerror(errno)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeKey;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &ev) != 0) {
    return absl::InternalError(
        absl::StrCat("epoll_ctl failed: ", strerror(errno)));
  }
  epoll_thread_ = std::thread([this] { EpollLoop(); });
  return absl::OkStatus();
}

void ConnectionParker::Nudge() const {
  if (!wake_.ok()) return;
  uint64_t one = 1;
  if (::write(wake_.get(), &one, sizeof(one)) < 0 && errno != EAGAIN) {
    spdlog::warn("connection parker: wake failed: {}", strerror(errno));
  }
}

void ConnectionParker::Run(Step step) {
  absl::MutexLock lock(&mu_);
  DispatchStep(std::move(step), Wake::kStart);
}

void ConnectionParker::Park(uint64_t key, int fd, absl::Time deadline,
                            Step step) {
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    DispatchStep(std::move(step), Wake::kStopping);
    return;
  }
  Watch& w = watches_[key];
  if (!w.dup.ok() || w.fd != fd) {
    if (w.dup.ok())
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, w.dup.get(), nullptr);
    w.dup.reset(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    w.fd = fd;
    w.news = false;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
    ev.data.u64 = key;
    // Adding reports what is there already as an event.
    if (!w.dup.ok() ||
        ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, w.dup.get(), &ev) != 0) {
      spdlog::error(
          "connection parker: cannot watch connection {} (fd {}): {}; "
          "closing it",
          key, fd, strerror(errno));
      w.dup.reset();
      DispatchStep(std::move(step), Wake::kStopping);
      return;
    }
  }
  if (w.news) {
    w.news = false;
    DispatchStep(std::move(step), Wake::kReadable);
    return;
  }
  w.parked = true;
  w.step = std::move(step);
  w.deadline = deadline;
  if (deadline != absl::InfiniteFuture()) {
    const bool earliest =
        deadlines_.empty() || deadline < deadlines_.begin()->first;
    deadlines_.insert({deadline, key});
    if (earliest) Nudge();
  }
}

void ConnectionParker::Forget(uint64_t key) {
  Step dropped;
  {
    absl::MutexLock lock(&mu_);
    auto it = watches_.find(key);
    if (it == watches_.end()) return;
    Watch& w = it->second;
    if (w.parked) dropped = std::move(w.step);
    deadlines_.erase({w.deadline, key});
    if (w.dup.ok()) {
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, w.dup.get(), nullptr);
    }
    watches_.erase(it);
  }
  // `dropped` (and what it captured) goes outside the lock.
}

void ConnectionParker::Unpark(uint64_t key, Watch* w) {
  w->parked = false;
  deadlines_.erase({w->deadline, key});
  w->deadline = absl::InfiniteFuture();
}

void ConnectionParker::StopParking() {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  stopping_ = true;
  for (auto& [key, w] : watches_) {
    if (!w.parked) continue;
    Unpark(key, &w);
    DispatchStep(std::move(w.step), Wake::kStopping);
    w.step = nullptr;
  }
}

void ConnectionParker::EpollLoop() {
  epoll_event events[64];
  for (;;) {
    int timeout_ms = 1000;  // also reaps workers that exited
    {
      absl::MutexLock lock(&mu_);
      if (joining_) return;
      absl::Time next = absl::InfiniteFuture();
      if (!deadlines_.empty()) next = deadlines_.begin()->first;
      if (!queue_.empty() && queue_.size() > idle_workers_) {
        next = std::min(next, queue_.front().queued + kStarvedAfter);
      }
      if (next != absl::InfiniteFuture()) {
        const absl::Duration left = next - absl::Now();
        timeout_ms = static_cast<int>(std::clamp<int64_t>(
            absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))),
            0, 1000));
      }
    }
    const int n = ::epoll_wait(epoll_.get(), events, 64, timeout_ms);
    if (n < 0 && errno != EINTR) {
      spdlog::error("connection parker: epoll_wait failed: {}",
                    strerror(errno));
      return;
    }
    JoinFinished();
    absl::MutexLock lock(&mu_);
    if (joining_) return;
    for (int i = 0; i < n; ++i) {
      const uint64_t key = events[i].data.u64;
      if (key == kWakeKey) {
        uint64_t count;
        while (::read(wake_.get(), &count, sizeof(count)) > 0) {
        }
        continue;
      }
      auto it = watches_.find(key);
      if (it == watches_.end()) continue;
      Watch& w = it->second;
      if (!w.parked) {
        w.news = true;  // the running step parks again: it runs at once
        continue;
      }
      Unpark(key, &w);
      DispatchStep(std::move(w.step), Wake::kReadable);
      w.step = nullptr;
    }
    const absl::Time now = absl::Now();
    if (Starved(now)) StartWorker();
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      const uint64_t key = deadlines_.begin()->second;
      Watch& w = watches_[key];
      Unpark(key, &w);
      DispatchStep(std::move(w.step), Wake::kTimedOut);
      w.step = nullptr;
    }
  }
}

void ConnectionParker::DispatchStep(Step step, Wake why) {
  Dispatch([step = std::move(step), why] { step(why); });
}

void ConnectionParker::Dispatch(std::function<void()> work) {
  queue_.push_back({std::move(work), absl::Now()});
  if (queue_.size() <= idle_workers_) {
    cv_.Signal();
  } else if (workers_.size() - finished_.size() < kPromptWorkers) {
    StartWorker();
  } else {
    Nudge();  // the epoll thread starts one if the work waits too long
  }
}

void ConnectionParker::StartWorker() {
  std::thread t([this] { WorkerLoop(); });
  const std::thread::id id = t.get_id();
  workers_.emplace(id, std::move(t));
}

bool ConnectionParker::Starved(absl::Time now) const {
  return !queue_.empty() && queue_.size() > idle_workers_ &&
         now - queue_.front().queued >= kStarvedAfter;
}

void ConnectionParker::WorkerLoop() {
  absl::MutexLock lock(&mu_);
  for (;;) {
    while (queue_.empty()) {
      if (joining_) return;
      ++idle_workers_;
      const bool timed_out = cv_.WaitWithTimeout(&mu_, worker_idle_);
      --idle_workers_;
      if (queue_.empty() && timed_out && !joining_ &&
          workers_.size() - finished_.size() > kKeepWorkers) {
        finished_.push_back(std::this_thread::get_id());
        return;
      }
    }
    std::function<void()> work = std::move(queue_.front().work);
    queue_.pop_front();
    mu_.Unlock();
    work();
    work = nullptr;  // what the step captured goes outside the lock
    mu_.Lock();
  }
}

void ConnectionParker::JoinFinished() {
  std::vector<std::thread> done;
  {
    absl::MutexLock lock(&mu_);
    for (const std::thread::id& id : finished_) {
      auto it = workers_.find(id);
      if (it == workers_.end()) continue;
      done.push_back(std::move(it->second));
      workers_.erase(it);
    }
    finished_.clear();
  }
  for (std::thread& t : done) t.join();
}

void ConnectionParker::Join() {
  {
    absl::MutexLock lock(&mu_);
    joining_ = true;
    cv_.SignalAll();
  }
  Nudge();
  if (epoll_thread_.joinable()) epoll_thread_.join();
  for (;;) {
    std::map<std::thread::id, std::thread> all;
    {
      absl::MutexLock lock(&mu_);
      cv_.SignalAll();
      if (workers_.empty()) break;
      all.swap(workers_);
      finished_.clear();
    }
    for (auto& [id, t] : all) t.join();
  }
}

size_t ConnectionParker::workers() {
  absl::MutexLock lock(&mu_);
  return workers_.size() - finished_.size();
}

size_t ConnectionParker::watched() {
  absl::MutexLock lock(&mu_);
  return watches_.size();
}

}  // namespace kreg
