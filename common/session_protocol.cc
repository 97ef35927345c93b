#include "common/session_protocol.h"

#include <algorithm>

namespace kreg {

bool NegotiateSessionProtocol(SessionProtocolVersion kregd,
                              SessionProtocolVersion client, uint32_t* minor,
                              std::string* refusal) {
  if (kregd.major == client.major) {
    *minor = std::min(kregd.minor, client.minor);
    return true;
  }
  auto text = [](SessionProtocolVersion v) {
    return std::to_string(v.major) + "." + std::to_string(v.minor);
  };
  const bool client_older = client.major < kregd.major;
  *refusal = "the client library speaks session protocol " + text(client) +
             " and kregd " + text(kregd) + ": " +
             (client_older ? "the client library" : "kregd") +
             " is older. Update " +
             (client_older ? "the client library (the kreg wheel)" : "kregd") +
             " so that both are from the same release";
  return false;
}

}  // namespace kreg
