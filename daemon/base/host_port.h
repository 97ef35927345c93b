// The one HOST:PORT parser (etcd endpoints, advertise, peer_listen, peer
// records, metrics_listen).
#ifndef KREGD_DAEMON_BASE_HOST_PORT_H_
#define KREGD_DAEMON_BASE_HOST_PORT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kreg {

struct HostPort {
  std::string host;        // without an [IPv6] address's brackets
  uint16_t port = 0;       // 1..65535
  bool bracketed = false;  // [host]:PORT
};

// INVALID_ARGUMENT saying what is wrong; the caller quotes `text`.
absl::StatusOr<HostPort> ParseHostPort(absl::string_view text);

}  // namespace kreg

#endif  // KREGD_DAEMON_BASE_HOST_PORT_H_
