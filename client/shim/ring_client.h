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

// Owns the client's mapping of the ring region and memfd, and its own
// indices. One launch at a time (the Conn is used by one thread at a time):
// Submit(), then Await() until kDone.
class ClientRing {
 public:
  // Creates a zeroed region (memfd sealed against shrinking, growing and
  // further sealing) and maps it. The caller sends its fd() in RingSetup.
  static ClientStatus Create(std::unique_ptr<ClientRing>* out);
  ~ClientRing();
  ClientRing(const ClientRing&) = delete;
  ClientRing& operator=(const ClientRing&) = delete;

  int fd() const { return fd_; }
  // Closes the fd once kregd has mapped the region.
  void CloseFd();

  // Encodes `launch` as the next descriptor, straight into its slot, and
  // publishes it, waking the executor if it sleeps. False (nothing
  // published) when it does not fit a slot: send it on the socket.
  bool Submit(const ring::DescriptorView& launch, uint64_t tag);

  enum class Wait { kDone, kClosed, kSlice };
  // Waits for the completion of the submitted launch: spins `spin_ns`,
  // then sleeps at most `slice_ns` on the completion doorbell. kDone with
  // its code and message (consumed); kClosed when the executor stopped
  // serving the ring; kSlice when the sleep ended without either (the
  // caller checks the socket: kregd reports a dead executor there).
  Wait Await(int64_t spin_ns, int64_t slice_ns, int* code,
             std::string* message);

 private:
  ClientRing(int fd, char* base) : fd_(fd), base_(base) {}

  int fd_;
  char* const base_;
  uint32_t sq_tail_ = 0;
  uint32_t cq_head_ = 0;
  uint64_t tag_ = 0;  // of the launch submitted last
};

}  // namespace shim
}  // namespace kreg

#endif  // KREGD_CLIENT_SHIM_RING_CLIENT_H_
