// The one HOST:PORT parser: etcd endpoints, advertise and peer_listen,
// peer records and metrics_listen all split their addresses here.
#ifndef KREGD_DAEMON_BASE_HOST_PORT_H_
#define KREGD_DAEMON_BASE_HOST_PORT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kreg {

struct HostPort {
  std::string host;  // without the brackets of an [IPv6] address
  uint16_t port = 0;
  bool bracketed = false;  // written as [host]:PORT
};

// Splits "HOST:PORT" or "[IPv6]:PORT" with a decimal port of 1 to 65535.
// INVALID_ARGUMENT saying what is wrong (the caller quotes `text`): no
// :PORT, [IPv6] without "]:", an empty host, an unbracketed host with a
// colon, a space, tab or '/' in the host, or a bad port (quoted).
absl::StatusOr<HostPort> ParseHostPort(absl::string_view text);

}  // namespace kreg

#endif  // KREGD_DAEMON_BASE_HOST_PORT_H_
