// Where kregd's Prometheus endpoint listens (`metrics_listen`): a loopback
// TCP address "127.0.0.1:9464" / "[::1]:9464", or "unix:/path". Other
// addresses are refused unless the operator opts in (`metrics_allow_remote`):
// the metrics name targets, uids and pids.
#ifndef KREGD_DAEMON_METRICS_LISTEN_ADDRESS_H_
#define KREGD_DAEMON_METRICS_LISTEN_ADDRESS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kreg {

struct MetricsAddress {
  enum class Kind { kTcp4, kTcp6, kUnix };
  Kind kind = Kind::kTcp4;
  std::string host;  // an IP literal (no brackets); empty for kUnix
  uint16_t port = 0;
  std::string path;  // kUnix
  bool loopback = false;

  // "127.0.0.1:9464", "[::1]:9464" or "unix:/run/kregd/metrics.sock".
  std::string ToString() const;
};

// Parses `text`. INVALID_ARGUMENT quoting it when: empty, not HOST:PORT with
// an IPv4 or bracketed IPv6 literal (host names are not resolved), a port
// outside 1-65535, a unix: path that is relative or too long for a socket,
// or a non-loopback address while `allow_remote` is false.
absl::StatusOr<MetricsAddress> ParseMetricsAddress(absl::string_view text,
                                                   bool allow_remote);

}  // namespace kreg

#endif  // KREGD_DAEMON_METRICS_LISTEN_ADDRESS_H_
