#include "common/ring_layout.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>

#include "common/stage_trace.h"

namespace kreg {
namespace stage {

namespace {
thread_local Times* t_stage = nullptr;
}  // namespace

Times* Current() { return t_stage; }
void SetCurrent(Times* times) { t_stage = times; }

}  // namespace stage

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

bool SpinWhileEqual(const Word& w, uint32_t value, int64_t spin_ns) {
  if (Load(w) != value) return true;
  if (spin_ns <= 0) return false;
  const int64_t deadline = NowNs() + spin_ns;
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
    if (NowNs() >= deadline) return false;
    // Let a runnable thread queued on this CPU (often the other side of
    // the ring, on an oversubscribed machine) run instead of spinning
    // against it; an instant syscall when nothing else is runnable.
    sched_yield();
  }
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

}  // namespace

bool MachineBusy() {
  static const bool adaptive = [] {
    const char* v = ::getenv("KREG_RING_ADAPTIVE");
    return v == nullptr || strcmp(v, "0") != 0;
  }();
  if (!adaptive) return false;
  const int64_t now = NowNs();
  int64_t last = g_busy_checked_ns.load(std::memory_order_relaxed);
  if (now - last < kBusyCheckNs || !g_busy_checked_ns.compare_exchange_strong(
                                       last, now, std::memory_order_relaxed)) {
    return g_busy.load(std::memory_order_relaxed);
  }
  const int runnable = RunnableTasks();
  if (runnable < 0) return false;
  const int cpus = UsableCpus();
  bool busy = g_busy.load(std::memory_order_relaxed);
  // Spinning threads are runnable too: once busy, the machine counts as
  // free again only when clearly below its CPUs (no flapping between the
  // two while everyone's spin comes and goes).
  if (!busy && runnable > cpus) {
    busy = true;
  } else if (busy && runnable * 4 <= cpus * 3) {
    busy = false;
  }
  g_busy.store(busy, std::memory_order_relaxed);
  return busy;
}

bool SpinThenWait(Word* w, uint32_t value, Word* waiting, int64_t spin_ns,
                  int64_t slice_ns) {
  // On a machine with more runnable threads than CPUs, a spinning waiter
  // takes the CPU the other side of the ring needs: sleep at once.
  if (spin_ns > 0 && MachineBusy()) spin_ns = 0;
  if (SpinWhileEqual(*w, value, spin_ns)) return true;
  Store(*waiting, 1);
  bool changed = Load(*w) != value;
  if (!changed) {
    FutexWait(w, value, slice_ns);
    changed = Load(*w) != value;
  }
  Store(*waiting, 0);
  return changed;
}

}  // namespace ring
}  // namespace kreg
