#include "daemon/base/host_port.h"

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kreg {

absl::StatusOr<HostPort> ParseHostPort(absl::string_view text) {
  HostPort out;
  absl::string_view host;
  absl::string_view port;
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find(']');
    if (close == absl::string_view::npos || close + 1 >= text.size() ||
        text[close + 1] != ':') {
      return absl::InvalidArgumentError("expected [IPv6]:PORT");
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
    out.bracketed = true;
  } else {
    const size_t colon = text.rfind(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError("no :PORT");
    }
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != absl::string_view::npos) {
      return absl::InvalidArgumentError(
          "an IPv6 address needs brackets: [::1]:PORT");
    }
  }
  if (host.empty()) return absl::InvalidArgumentError("empty host");
  if (host.find_first_of(" \t/") != absl::string_view::npos) {
    return absl::InvalidArgumentError("the host has a space, tab or '/'");
  }
  uint32_t number = 0;
  if (port.empty() || port.size() > 5 ||
      !absl::c_all_of(port, absl::ascii_isdigit) ||
      !absl::SimpleAtoi(port, &number) || number == 0 || number > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("port \"", absl::CHexEscape(port),
                     "\" is not a number from 1 to 65535"));
  }
  out.host = std::string(host);
  out.port = static_cast<uint16_t>(number);
  return out;
}

}  // namespace kreg
