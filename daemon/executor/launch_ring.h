// kregd-exec's side of a session's shared-memory launch ring (DESIGN §9,
// layout in ring_layout.h).
#ifndef KREGD_DAEMON_EXECUTOR_LAUNCH_RING_H_
#define KREGD_DAEMON_EXECUTOR_LAUNCH_RING_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/ring_layout.h"
#include "common/unique_fd.h"

namespace kreg {

// Owns the mapping of one session's ring region and the executor's own
// indices (it never reads its indices back from shared memory, and checks
// the client's against them). Take() and Complete() are called by one
// thread (the session's ring thread); Stop() from any. Unmapped by the
// destructor, which must run after the ring thread ended.
class LaunchRing {
 public:
  // Maps `fd` as a ring region of `size` bytes: a memfd sealed with
  // F_SEAL_SHRINK (so the mapping can never be truncated under the
  // executor) holding at least ring::kRegionBytes; `size` must be exactly
  // ring::kRegionBytes. INVALID_ARGUMENT otherwise, INTERNAL if mmap fails.
  static absl::StatusOr<std::unique_ptr<LaunchRing>> Map(UniqueFd fd,
                                                         uint64_t size);
  ~LaunchRing();
  LaunchRing(const LaunchRing&) = delete;
  LaunchRing& operator=(const LaunchRing&) = delete;

  enum class Next { kDescriptor, kStopped, kBroken };
  // Waits for the next published descriptor (spins as `spin` has learnt
  // from this ring's recent gaps, then sleeps on the submission doorbell: a
  // client calling back to back, e.g. after a GPU round trip, finds the
  // thread awake; an idle one finds it asleep) and copies it into `out`: the
  // bytes its `length` announced when read, at least a header's worth and at
  // most a slot (the decoder tells a torn write by the mismatch). kStopped
  // after Stop(); kBroken with `why` when the client's indices are impossible
  // (it published more than a ring's worth, or consumed completions it was
  // never given).
  Next Take(ring::SpinPolicy* spin, std::string* out, std::string* why);
  // sq position of the descriptor Take() returned last.
  uint32_t seq() const { return head_ - 1; }
  // Publishes the completion of that descriptor and wakes a sleeping
  // client. A message longer than a completion entry is cut, ending with a
  // marker that says how long it was. `flags`: ring::kDoneSignalled,
  // ring::kMappingMissing (CUDA launches).
  // `trace`: the executor's stage stamps of a launch submitted with
  // ring::kSubmitTrace, written to the slot's StageTrailer.
  void Complete(uint64_t tag, const absl::Status& status, uint32_t flags = 0,
                const ring::StageTrailer* trace = nullptr);
  // Makes Take() return kStopped (now, or after the launch in progress) and
  // marks the ring closed for the client. Wakes a sleeping Take(); a wake
  // can race the thread going to sleep, so callers repeat it until the ring
  // thread has left.
  void Stop();

 private:
  LaunchRing(UniqueFd fd, char* base);

  UniqueFd fd_;
  char* const base_;
  uint32_t head_ = 0;     // descriptors taken
  uint32_t cq_tail_ = 0;  // completions published
  std::atomic<bool> stop_{false};
};

}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_LAUNCH_RING_H_
