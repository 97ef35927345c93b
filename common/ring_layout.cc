#include "common/ring_layout.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/stage_trace.h"

namespace kreg {
namespace stage {

thread_local Times* t_stage = nullptr;

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

bool SpinThenWait(Word* w, uint32_t value, Word* waiting, int64_t spin_ns,
                  int64_t slice_ns) {
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
