// The request head of the metrics endpoint's tiny HTTP/1.x server. Bytes
// come from anyone who can connect: every malformed, oversized or
// unexpected head gets a definite verdict, never a crash or a wait for more
// than the limit.
#ifndef KREGD_DAEMON_METRICS_HTTP_REQUEST_H_
#define KREGD_DAEMON_METRICS_HTTP_REQUEST_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace kreg {

// Request heads larger than this are refused (431).
constexpr size_t kMaxHttpHeadBytes = 8192;

struct HttpHead {
  enum class State {
    kIncomplete,  // no blank line yet, within the limit: read more
    kComplete,    // method, target and version parsed
    kError,       // answer `status` with `reason` and close
  };
  State state = State::kIncomplete;
  int status = 0;  // kError: 400, 431, 501 or 505
  std::string reason;
  std::string method;
  std::string target;     // the request target with any query removed
  int minor_version = 0;  // HTTP/1.<minor>
  size_t head_bytes = 0;  // kComplete: bytes up to and including the blank line
};

// Parses the request head at the start of `buf` (lines end in CRLF or LF).
// Headers are checked for syntax (a name of token characters, a colon) and
// otherwise ignored; a request with a body (Content-Length other than 0, or
// Transfer-Encoding) is refused with 400 since nothing here takes one.
HttpHead ParseHttpHead(absl::string_view buf,
                       size_t max_bytes = kMaxHttpHeadBytes);

// What the metrics server answers to a parsed head: 200 (GET or HEAD
// /metrics), 404 (another path), 405 (another method).
int RouteMetricsRequest(const HttpHead& head);

}  // namespace kreg

#endif  // KREGD_DAEMON_METRICS_HTTP_REQUEST_H_
