#include "daemon/metrics/listen_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/un.h>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/base/host_port.h"

namespace kreg {
namespace {

absl::Status Bad(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("metrics_listen \"", absl::CHexEscape(text), "\": ", why,
                   "; use 127.0.0.1:PORT, [::1]:PORT or unix:/absolute/path"));
}

}  // namespace

std::string MetricsAddress::ToString() const {
  switch (kind) {
    case Kind::kUnix:
      return absl::StrCat("unix:", path);
    case Kind::kTcp6:
      return absl::StrCat("[", host, "]:", port);
    case Kind::kTcp4:
      break;
  }
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<MetricsAddress> ParseMetricsAddress(absl::string_view text,
                                                   bool allow_remote) {
  MetricsAddress a;
  if (text.empty()) return Bad(text, "empty address");
  if (absl::StartsWith(text, "unix:")) {
    absl::string_view path = text.substr(5);
    if (path.empty() || path[0] != '/') {
      return Bad(text, "a unix: socket path must be absolute");
    }
    if (path.size() >= sizeof(sockaddr_un{}.sun_path)) {
      return Bad(text,
                 absl::StrCat("a unix: socket path may have at most ",
                              sizeof(sockaddr_un{}.sun_path) - 1, " bytes"));
    }
    if (path.find('\0') != absl::string_view::npos) {
      return Bad(text, "the socket path contains a NUL byte");
    }
    a.kind = MetricsAddress::Kind::kUnix;
    a.path = std::string(path);
    a.loopback = true;
    return a;
  }
  absl::StatusOr<HostPort> hp = ParseHostPort(text);
  if (!hp.ok()) return Bad(text, hp.status().message());
  a.kind =
      hp->bracketed ? MetricsAddress::Kind::kTcp6 : MetricsAddress::Kind::kTcp4;
  a.port = hp->port;
  a.host = hp->host;
  if (a.kind == MetricsAddress::Kind::kTcp4) {
    in_addr v4{};
    if (inet_pton(AF_INET, a.host.c_str(), &v4) != 1) {
      return Bad(text, absl::StrCat("\"", absl::CHexEscape(a.host),
                                    "\" is not an IPv4 address (host names "
                                    "are not resolved)"));
    }
    a.loopback = (ntohl(v4.s_addr) >> 24) == 127;
  } else {
    in6_addr v6{};
    if (inet_pton(AF_INET6, a.host.c_str(), &v6) != 1) {
      return Bad(text, absl::StrCat("\"", absl::CHexEscape(a.host),
                                    "\" is not an IPv6 address"));
    }
    a.loopback = IN6_IS_ADDR_LOOPBACK(&v6);
  }
  if (!a.loopback && !allow_remote) {
    return Bad(text,
               "not a loopback address: the metrics name targets, uids and "
               "pids, so kregd serves them off the host only when "
               "metrics_allow_remote = true (--metrics-allow-remote)");
  }
  return a;
}

}  // namespace kreg
