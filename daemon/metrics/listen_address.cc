#include "daemon/metrics/listen_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/un.h>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

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
  absl::string_view host;
  absl::string_view port;
  if (text[0] == '[') {
    size_t close = text.find(']');
    if (close == absl::string_view::npos || close + 1 >= text.size() ||
        text[close + 1] != ':') {
      return Bad(text, "expected [IPv6]:PORT");
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
    a.kind = MetricsAddress::Kind::kTcp6;
  } else {
    size_t colon = text.rfind(':');
    if (colon == absl::string_view::npos) {
      return Bad(text, "no :PORT (and not unix:/path)");
    }
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != absl::string_view::npos) {
      return Bad(text, "an IPv6 address needs brackets: [::1]:PORT");
    }
    a.kind = MetricsAddress::Kind::kTcp4;
  }
  uint32_t port_number = 0;
  if (port.empty() || !absl::c_all_of(port, absl::ascii_isdigit) ||
      port.size() > 5 || !absl::SimpleAtoi(port, &port_number) ||
      port_number == 0 || port_number > 65535) {
    return Bad(text, absl::StrCat("port \"", absl::CHexEscape(port),
                                  "\" is not a number from 1 to 65535"));
  }
  a.port = static_cast<uint16_t>(port_number);
  a.host = std::string(host);
  if (a.kind == MetricsAddress::Kind::kTcp4) {
    in_addr v4{};
    if (inet_pton(AF_INET, a.host.c_str(), &v4) != 1) {
      return Bad(text, absl::StrCat("\"", absl::CHexEscape(host),
                                    "\" is not an IPv4 address (host names "
                                    "are not resolved)"));
    }
    a.loopback = (ntohl(v4.s_addr) >> 24) == 127;
  } else {
    in6_addr v6{};
    if (inet_pton(AF_INET6, a.host.c_str(), &v6) != 1) {
      return Bad(text, absl::StrCat("\"", absl::CHexEscape(host),
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
