// The session protocol's version (kreg.v1 session.proto), which executors
// speak with clients; kregd compares it when it re-adopts an executor an
// earlier kregd left running (DESIGN §12).
#ifndef KREGD_DAEMON_SESSION_PROTOCOL_VERSION_H_
#define KREGD_DAEMON_SESSION_PROTOCOL_VERSION_H_

#include <cstdint>

namespace kreg {

// A different major is refused at Hello (and a re-adopted executor of
// another major is drained).
constexpr uint32_t kSessionProtocolMajor = 1;
// 1: CUDA; 2: doorbell; 3: fd uploads (RegisterRequest.upload_fd_size);
// 4: the launch ring (HelloReply.launch_ring, RingSetup); 5: CUDA launches on
// the launch ring (ring layout version 2); 6: BindLocal (local execution).
constexpr uint32_t kSessionProtocolMinor = 6;

}  // namespace kreg

#endif  // KREGD_DAEMON_SESSION_PROTOCOL_VERSION_H_
