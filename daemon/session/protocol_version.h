// The session protocol's version (kreg.v1 session.proto), which executors
// speak with clients; kregd compares it when it re-adopts an executor an
// earlier kregd left running (DESIGN §12).
#ifndef KREGD_DAEMON_SESSION_PROTOCOL_VERSION_H_
#define KREGD_DAEMON_SESSION_PROTOCOL_VERSION_H_

#include <cstdint>

namespace kreg {

// A different major is refused at Hello (and a re-adopted executor of
// another major is drained). 1.x: 1.1 CUDA; 1.2 doorbell; 1.3 fd uploads;
// 1.4 the launch ring (HelloReply.launch_ring, RingSetup); 1.5 CUDA launches
// on the launch ring (ring layout version 2); 1.6 BindLocal (local
// execution). 2.0: registrations and targets are registration.proto's
// RegisterTargetHeader, RegisterTargetResponse and Target (shared with the
// gRPC service) instead of flattened copies; uploads travel only by fd.
constexpr uint32_t kSessionProtocolMajor = 2;
constexpr uint32_t kSessionProtocolMinor = 0;

}  // namespace kreg

#endif  // KREGD_DAEMON_SESSION_PROTOCOL_VERSION_H_
