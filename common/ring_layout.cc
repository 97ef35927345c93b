#include "common/ring_layout.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>

namespace kreg {
namespace ring {

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

void FutexWait(Word* w, uint32_t expected, int64_t timeout_ns) {
  timespec ts;
  timespec* tp = nullptr;
  if (timeout_ns >= 0) {
    ts.tv_sec = timeout_ns / 1000000000;
    ts.tv_nsec = timeout_ns % 1000000000;
    tp = &ts;
  }
  // Not FUTEX_PRIVATE_FLAG: the word lives in memory two processes map.
  ::syscall(SYS_futex, &w->value, FUTEX_WAIT, expected, tp, nullptr, 0);
}

void FutexWake(Word* w) {
  ::syscall(SYS_futex, &w->value, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

bool SpinWhileEqual(const Word& w, uint32_t value, int64_t spin_ns,
                    bool* preempted) {
  if (Load(w) != value) return true;
  if (spin_ns <= 0) return false;
  // 64 pauses take a few microseconds; a longer gap between two clock
  // reads means another thread had this CPU (or the vCPU was not running).
  constexpr int64_t kPreemptedNs = 20 * 1000;
  int64_t last = NowNs();
  const int64_t deadline = last + spin_ns;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#elif defined(__aarch64__)
      asm volatile("yield");
#endif
      if (__atomic_load_n(&w.value, __ATOMIC_ACQUIRE) != value) {
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        return true;
      }
    }
    const int64_t now = NowNs();
    if (preempted != nullptr && now - last > kPreemptedNs) *preempted = true;
    if (now >= deadline) return false;
    last = now;
    // Let a runnable thread queued on this CPU (often the other side of
    // the ring, on an oversubscribed machine) run instead of spinning
    // against it; an instant syscall when nothing else is runnable.
    sched_yield();
  }
}

bool SpinPolicy::AdaptiveDefault() {
  static const bool adaptive = [] {
    const char* v = ::getenv("KREG_RING_ADAPTIVE");
    return v == nullptr || strcmp(v, "0") != 0;
  }();
  return adaptive;
}

SpinPolicy::SpinPolicy(int64_t limit_ns, bool adaptive)
    : limit_ns_(std::max<int64_t>(limit_ns, 0)), adaptive_(adaptive) {}

int64_t SpinPolicy::Base() const {
  return std::clamp(typical_ns_ + typical_ns_ / 4, limit_ns_,
                    kStretch * limit_ns_);
}

int64_t SpinPolicy::Next() {
  if (!adaptive_ || limit_ns_ == 0) return limit_ns_;
  if (skip_ > 0) {
    --skip_;
    return 0;
  }
  // Each wait a full spin would have missed halves the spin; under a
  // microsecond it is not worth a clock read: sleep at once.
  const int64_t spin = Base() >> misses_;
  return spin < 1000 ? 0 : spin;
}

void SpinPolicy::Record(int64_t waited_ns, bool spun, bool preempted) {
  if (!adaptive_ || limit_ns_ == 0) return;
  if (preempted) {
    backoff_ = std::min(std::max(1, backoff_ * 2), kMaxBackoff);
    skip_ = backoff_;
    return;
  }
  if (spun) backoff_ /= 2;
  // Only waits a (stretched) spin could catch say how long it should be.
  if (waited_ns <= kStretch * limit_ns_) {
    typical_ns_ =
        typical_ns_ == 0 ? waited_ns : (typical_ns_ * 3 + waited_ns) / 4;
  }
  misses_ = waited_ns <= Base() ? 0 : std::min(misses_ + 1, 30);
}

namespace {

// CPUs this process may run on.
int UsableCpus() {
  static const int n = [] {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    return online > 0 ? static_cast<int>(online) : 1;
  }();
  return n;
}

// Runnable tasks on the machine now (/proc/loadavg's fourth field, "r/t");
// -1 when it cannot be read.
int RunnableTasks() {
  int fd = ::open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[128];
  ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return -1;
  buf[n] = '\0';
  const char* p = buf;
  for (int spaces = 0; *p != '\0' && spaces < 3; ++p) {
    if (*p == ' ') ++spaces;
  }
  int r = 0;
  bool digits = false;
  for (; *p >= '0' && *p <= '9'; ++p) {
    r = r * 10 + (*p - '0');
    digits = true;
  }
  return digits && *p == '/' ? r : -1;
}

constexpr int64_t kBusyCheckNs = 5 * 1000 * 1000;
std::atomic<int64_t> g_busy_checked_ns{0};
std::atomic<bool> g_busy{false};
// This process's threads spinning in SpinThenWait now (runnable, but
// waiting for the other side: not load).
std::atomic<int> g_spinning{0};

}  // namespace

bool BusyAfter(bool busy, int runnable, int cpus) {
  // Spinning threads are runnable too: once busy, the machine counts as
  // free again only at its CPUs (no flapping while spins come and go).
  if (!busy) return runnable > 2 * cpus;
  return runnable > cpus;
}

bool MachineBusy() {
  if (!SpinPolicy::AdaptiveDefault()) return false;
  const int64_t now = NowNs();
  int64_t last = g_busy_checked_ns.load(std::memory_order_relaxed);
  if (now - last < kBusyCheckNs || !g_busy_checked_ns.compare_exchange_strong(
                                       last, now, std::memory_order_relaxed)) {
    return g_busy.load(std::memory_order_relaxed);
  }
  const int runnable = RunnableTasks();
  if (runnable < 0) return false;
  const bool busy = BusyAfter(
      g_busy.load(std::memory_order_relaxed),
      runnable - g_spinning.load(std::memory_order_relaxed), UsableCpus());
  g_busy.store(busy, std::memory_order_relaxed);
  return busy;
}

bool SpinThenWait(Word* w, uint32_t value, Word* waiting, SpinPolicy* policy,
                  int64_t slice_ns) {
  const int64_t start = NowNs();
  int64_t spin_ns = policy->Next();
  if (spin_ns > 0 && MachineBusy()) spin_ns = 0;
  bool preempted = false;
  bool changed;
  if (spin_ns > 0) {
    g_spinning.fetch_add(1, std::memory_order_relaxed);
    changed = SpinWhileEqual(*w, value, spin_ns, &preempted);
    g_spinning.fetch_sub(1, std::memory_order_relaxed);
  } else {
    changed = Load(*w) != value;
  }
  if (!changed) {
    Store(*waiting, 1);
    changed = Load(*w) != value;
    if (!changed) {
      FutexWait(w, value, slice_ns);
      changed = Load(*w) != value;
    }
    Store(*waiting, 0);
  }
  // A sleep slice that ended without a change was a long wait too.
  policy->Record(NowNs() - start, spin_ns > 0, preempted);
  return changed;
}

}  // namespace ring
}  // namespace kreg
