// The shim's side of a session's shared-memory launch ring (DESIGN §9,
// layout in common/ring_layout.h).
#ifndef KREGD_CLIENT_SHIM_RING_CLIENT_H_
#define KREGD_CLIENT_SHIM_RING_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "common/ring_encode.h"
#include "common/status.h"

namespace kreg {
namespace shim {

// A zeroed memfd of `size` bytes (sealed against shrinking, growing and
// further sealing) mapped read-write at `*base`, for kregd to map too.
// RESOURCE_EXHAUSTED "cannot create|map <what>: ..." when it cannot be had.
ClientStatus CreateSharedRegion(const char* name, uint64_t size,
                                const std::string& what, int* fd, char** base);

// Owns the client's mapping of the ring region and memfd, and its own
// indices. Used by one thread at a time (the Conn's). Up to ring::kSlots
// launches may be in flight (asynchronous CUDA launches); completions come
// back in submission order: Await() returns the oldest one's.
class ClientRing {
 public:
  // Creates a zeroed region (memfd sealed against shrinking, growing and
  // further sealing) and maps it. The caller sends its fd() in RingSetup.
  // `spin_ns`: the longest a completion wait spins (ring::SpinPolicy).
  static ClientStatus Create(int64_t spin_ns, std::unique_ptr<ClientRing>* out);
  ~ClientRing();
  ClientRing(const ClientRing&) = delete;
  ClientRing& operator=(const ClientRing&) = delete;

  int fd() const { return fd_; }
  // Closes the fd once kregd has mapped the region.
  void CloseFd();

  // Encodes `launch` as the next descriptor, straight into its slot, and
  // publishes it, waking the executor if it sleeps. False (nothing
  // published) when it does not fit a slot: send it on the socket.
  // The caller keeps in_flight() below ring::kSlots (Await() first).
  bool Submit(const ring::DescriptorView& launch, uint64_t tag);

  // Launches submitted whose completion was not consumed yet.
  uint32_t in_flight() const { return sq_tail_ - cq_head_; }
  // The oldest launch in flight has completed (Await() returns at once).
  bool Ready() const;

  enum class Wait { kDone, kClosed, kSlice };
  // Waits for the completion of the oldest launch in flight: spins as
  // its ring::SpinPolicy says, then sleeps at most `slice_ns` on the
  // completion doorbell.
  // kDone with its code, message and flags (ring::kDoneSignalled, ...;
  // consumed); kClosed when the executor stopped serving the ring; kSlice
  // when the sleep ended without either (the caller checks the socket:
  // kregd reports a dead executor there).
  Wait Await(int64_t slice_ns, int* code, std::string* message,
             uint32_t* flags = nullptr);

 private:
  ClientRing(int fd, char* base, int64_t spin_ns)
      : fd_(fd), base_(base), spin_(spin_ns) {}

  int fd_;
  char* const base_;
  ring::SpinPolicy spin_;
  uint32_t sq_tail_ = 0;
  uint32_t cq_head_ = 0;
  uint64_t tags_[ring::kSlots] = {};  // of the launches in flight, by sq
};

}  // namespace shim
}  // namespace kreg

#endif  // KREGD_CLIENT_SHIM_RING_CLIENT_H_
