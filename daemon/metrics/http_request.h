// One request of the metrics endpoint, from the client's bytes to kregd's
// reply, with Boost.Beast's HTTP/1.x parser. Bytes come from anyone who can
// connect: every malformed, oversized or unexpected head gets a definite
// answer, never a crash or a wait for more than the limit.
#ifndef KREGD_DAEMON_METRICS_HTTP_REQUEST_H_
#define KREGD_DAEMON_METRICS_HTTP_REQUEST_H_

#include <cstddef>
#include <functional>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace kreg {

// Request heads larger than this are refused (431).
constexpr size_t kMaxHttpHeadBytes = 8192;

// The whole reply to the request head at the start of `in` (anything after
// the head is ignored), or nullopt while the head is incomplete and
// shorter than `max_bytes`: 200 with `render()` for GET or HEAD /metrics
// (a query is ignored), 404 for another path, 405 for another method; 400
// for a malformed head, a target that is not a path or a request with a
// body, 431 past `max_bytes`, 505 for an HTTP version other than 1.x.
// `render` is called for a 200 only.
std::optional<std::string> AnswerMetricsRequest(
    absl::string_view in, size_t max_bytes,
    const std::function<std::string()>& render);

// "HTTP/1.1 <status> <reason>\r\n" plus headers and `body` (omitted for
// HEAD but counted in Content-Length); the connection closes after it.
std::string HttpResponse(int status, const std::string& body, bool head_only);

}  // namespace kreg

#endif  // KREGD_DAEMON_METRICS_HTTP_REQUEST_H_
