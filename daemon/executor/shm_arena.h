// The shared-memory arena of one client session (DESIGN §3, CPU buffers).
#ifndef KREGD_DAEMON_EXECUTOR_SHM_ARENA_H_
#define KREGD_DAEMON_EXECUTOR_SHM_ARENA_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace kreg {

// Owns the daemon's mapping of one session's memfd arena. The client grows
// the arena by sending a bigger memfd; the old mapping is released then, and
// everything is released by the destructor (session close).
// Thread-compatible: a session's arena is used only by its session thread.
class ShmArena {
 public:
  // `max_bytes` bounds every arena this object will map.
  explicit ShmArena(uint64_t max_bytes);
  ~ShmArena();
  ShmArena(const ShmArena&) = delete;
  ShmArena& operator=(const ShmArena&) = delete;

  // Maps the memfd `fd` as the arena of `size` bytes, replacing (and
  // unmapping) the current one. The memfd must be sealed with F_SEAL_SHRINK
  // and be at least `size` bytes long, so the mapping can never be truncated
  // under a running handler. INVALID_ARGUMENT (size 0, fd not a sealed memfd,
  // fd smaller than size), RESOURCE_EXHAUSTED (size above the limit),
  // INTERNAL (mmap failed). On error the current arena is kept.
  absl::Status Replace(UniqueFd fd, uint64_t size);

  // The address of [offset, offset + size) inside the arena. OUT_OF_RANGE
  // quoting the values when the region overflows or ends past the arena.
  // A zero-size region at or before the end is valid.
  absl::StatusOr<char*> Region(uint64_t offset, uint64_t size) const;

  // Unmaps and closes the arena (the session ended).
  void Reset();

  uint64_t size() const { return size_; }

 private:
  const uint64_t max_bytes_;
  UniqueFd fd_;
  char* base_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_SHM_ARENA_H_
