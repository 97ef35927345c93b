// The status page an executor shares with kregd (DESIGN §8): a memfd kregd
// creates and maps, and the executor maps too. The executor writes, per
// session slot, which target it is running and since when; kregd reads it to
// name the target when the executor dies and to enforce launch_timeout.
// After the slots comes a table of per-target statistics (target_stats.h),
// indexed by the token kregd gave the executor for each target it resolved.
// Everything kregd reads from it is untrusted (a kernel shares the
// executor's address space): values are range-checked before use.
#ifndef KREGD_DAEMON_BASE_STATUS_PAGE_H_
#define KREGD_DAEMON_BASE_STATUS_PAGE_H_

#include <fcntl.h>

#include <atomic>
#include <cstdint>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "daemon/base/served_session.h"
#include "daemon/base/target_stats.h"

namespace kreg {

// One session's slot. `token` is 0 while no handler runs. `gpu_token` is
// the token of the session's last CUDA launch, whose GPU work may still run
// after the handler returned (0: none since the session was adopted): when
// the executor exits for a sticky CUDA error found after the handler
// returned, kregd names that target.
struct ExecSlot {
  std::atomic<uint64_t> request_id;
  std::atomic<int64_t> started_ns;  // CLOCK_MONOTONIC
  std::atomic<uint32_t> token;
  // The CUDA target of the session's last CUDA launch (kregd's token).
  std::atomic<uint32_t> gpu_token;
  // Handler calls of the session in this slot, and its arena's size.
  std::atomic<uint64_t> launches;
  std::atomic<uint64_t> arena_bytes;
  // Call-site states the session holds (handler bundles).
  std::atomic<uint64_t> states;
};
static_assert(sizeof(ExecSlot) == 48, "the status page layout");

struct ExecStatusHeader {
  uint32_t magic;
  uint32_t slots;
  SessionCounters counters;  // the executor's sessions count here
  // Set by the executor before it exits on purpose (sticky CUDA error):
  // 1 after a handler call saw it (that call's reply carried the error),
  // 2 when its sticky-error watch found it (kExitGpuFault): in-flight GPU
  // work of every session may be lost.
  std::atomic<uint32_t> recycle;
  // 1 + the slot whose session thread took a fatal signal (SIGSEGV,
  // SIGBUS, SIGFPE, SIGILL, SIGABRT, ...) while running that session's
  // handler, written by the executor's crash handler; 0 when not known
  // (another thread, a kill from outside, an older kregd-exec). kregd then
  // blames that session's target alone.
  std::atomic<uint32_t> faulted_slot;
  // How the executor ended, written by itself just before: kExitKnown | its
  // wait status (exit code << 8, or the fatal signal); 0 when it could not
  // say (SIGKILL). A kregd that did not start it cannot waitpid() for it
  // (DESIGN §12: re-adopted executors) and reads this instead.
  std::atomic<uint32_t> exit_status;
  // Last words (NUL-terminated): an uncaught exception's what(), the
  // sticky CUDA error. Written only just before the executor dies.
  char note[236];
};
constexpr uint32_t kExitKnown = 1u << 16;

// "kre" + layout version: a kregd-exec of another layout refuses the page.
constexpr uint32_t kExecStatusMagic = 0x6b726503;
// Rows of the statistics table: tokens 1..kStatsRows have one; calls of
// targets with larger tokens are not counted per target.
constexpr uint32_t kStatsRows = 1024;

// Seals of every page kregd creates: nobody can resize it under kregd's
// mapping.
constexpr int kPageSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

// Owns one mapping of a status page. Thread-safe (atomics only).
class StatusPage {
 public:
  // Creates a page with `slots` slots (kregd). INTERNAL on failure.
  static absl::StatusOr<StatusPage> Create(uint32_t slots);
  // Maps an existing page; INVALID_ARGUMENT when `fd` is not a page of
  // `slots` slots or, with `require_seals` (kregd mapping a page an
  // executor offers, DESIGN §12), not sealed against resizing.
  static absl::StatusOr<StatusPage> Map(UniqueFd fd, uint32_t slots,
                                        bool require_seals = false);

  StatusPage(StatusPage&& o) noexcept;
  StatusPage& operator=(StatusPage&& o) noexcept;
  ~StatusPage();

  ExecStatusHeader* header() const { return header_; }
  // Null when `i` is out of range.
  ExecSlot* slot(uint32_t i) const;
  uint32_t slots() const { return slots_; }
  // The statistics row of `token`; null for 0 or beyond kStatsRows.
  StatsRow* stats_row(uint32_t token) const;
  int fd() const { return fd_.get(); }
  // The note, bounded and printable-only.
  std::string Note() const;

 private:
  StatusPage(UniqueFd fd, void* base, size_t size, uint32_t slots);
  static size_t SizeFor(uint32_t slots);

  UniqueFd fd_;
  void* base_ = nullptr;
  size_t size_ = 0;
  uint32_t slots_ = 0;
  ExecStatusHeader* header_ = nullptr;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_BASE_STATUS_PAGE_H_
