#include "daemon/base/host_port.h"

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kreg {

absl::StatusOr<HostPort> ParseHostPort(absl::string_view text) {
  HostPort out;
  const size_t colon = text.rfind(':');
  out.bracketed = !text.empty() && text[0] == '[';
  if (out.bracketed && text.find(']') + 1 != colon) {
    return absl::InvalidArgumentError("expected [IPv6]:PORT");
  }
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError("no :PORT");
  }
  absl::string_view host =
      text.substr(out.bracketed, colon - 2 * out.bracketed);
  absl::string_view port = text.substr(colon + 1);
  if (!out.bracketed && host.find(':') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        "an IPv6 address needs brackets: [::1]:PORT");
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
