// The session protocol's version (kreg.v1 session.proto), which executors
// speak with clients; kregd compares it when it re-adopts an executor an
// earlier kregd left running (DESIGN §12).
#ifndef KREGD_DAEMON_SESSION_PROTOCOL_VERSION_H_
#define KREGD_DAEMON_SESSION_PROTOCOL_VERSION_H_

#include <cstdint>

namespace kreg {

// A different major is refused at Hello (and a re-adopted executor of
// another major is drained). Minors are additive: 1.1 CUDA; 1.2 doorbell;
// 1.3 fd uploads; 1.4 the launch ring (HelloReply.launch_ring, RingSetup);
// 1.5 CUDA launches on the launch ring (ring layout version 2); 1.6
// BindLocal (local execution); 1.7 registrations and targets as
// registration.proto's RegisterTargetHeader, RegisterTargetResponse and
// Target (shared with the gRPC service); 1.8 nothing for clients: an
// executor offering itself to a new kregd and that kregd prove the adoption
// key to each other by challenge-response (executor.proto). A 1.0-1.6
// client still gets its flat messages (daemon/session/legacy_registration.h).
constexpr uint32_t kSessionProtocolMajor = 1;
constexpr uint32_t kSessionProtocolMinor = 8;

// The first minor whose clients send and read registration.proto's
// messages; an older client's are mapped (legacy_registration.h).
constexpr uint32_t kFirstEmbeddedRegistrationMinor = 7;

// The first minor whose executors kregd re-adopts: 1.7 changed the
// registration messages an executor relays to kregd (executor.proto's
// BrokerRequest); a 1.7 executor sends its adoption key to whoever listens
// on the supervision socket, where 1.8 proves it by challenge-response. An
// older executor is drained instead (DESIGN §12).
constexpr uint32_t kOldestAdoptableProtocolMinor = 8;

}  // namespace kreg

#endif  // KREGD_DAEMON_SESSION_PROTOCOL_VERSION_H_
