// The session protocol's version (proto/kreg/v1/session.proto), which the
// client library and kregd (its executors) both speak, and the one rule by
// which two of them agree on it (docs/design.md §3, "Session protocol
// versions").
#ifndef KREGD_COMMON_SESSION_PROTOCOL_H_
#define KREGD_COMMON_SESSION_PROTOCOL_H_

#include <cstdint>
#include <string>

namespace kreg {

// 2.0 is the first public version. A later minor only adds; what it adds
// is used only when the agreed minor (NegotiateSessionProtocol) is at
// least that minor.
constexpr uint32_t kSessionProtocolMajor = 2;
constexpr uint32_t kSessionProtocolMinor = 0;

struct SessionProtocolVersion {
  uint32_t major;
  uint32_t minor;
};

// The minor a session between `kregd` and `client` speaks: the majors must
// be equal, and the lower of the two minors is used. Otherwise false and
// `*refusal` says both versions, which side is older and what to do.
bool NegotiateSessionProtocol(SessionProtocolVersion kregd,
                              SessionProtocolVersion client, uint32_t* minor,
                              std::string* refusal);

}  // namespace kreg

#endif  // KREGD_COMMON_SESSION_PROTOCOL_H_
