#include "daemon/metrics/http_request.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kreg {
namespace {

// RFC 9110 tchar.
bool IsTokenChar(char c) {
  if (absl::ascii_isalnum(static_cast<unsigned char>(c))) return true;
  switch (c) {
    case '!':
    case '#':
    case '$':
    case '%':
    case '&':
    case '\'':
    case '*':
    case '+':
    case '-':
    case '.':
    case '^':
    case '_':
    case '`':
    case '|':
    case '~':
      return true;
    default:
      return false;
  }
}

HttpHead Error(int status, std::string reason) {
  HttpHead h;
  h.state = HttpHead::State::kError;
  h.status = status;
  h.reason = std::move(reason);
  return h;
}

// One line without its terminator (CRLF or LF); `rest` advances past it.
// False when no terminator is in `rest`.
bool NextLine(absl::string_view* rest, absl::string_view* line) {
  size_t nl = rest->find('\n');
  if (nl == absl::string_view::npos) return false;
  *line = rest->substr(0, nl);
  if (!line->empty() && line->back() == '\r') line->remove_suffix(1);
  rest->remove_prefix(nl + 1);
  return true;
}

// "METHOD SP TARGET SP HTTP/1.x" into `h` (method, target without its
// query, minor version); false with `*h` the error to answer.
bool ParseRequestLine(absl::string_view line, HttpHead* h) {
  size_t sp1 = line.find(' ');
  size_t sp2 = sp1 == absl::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == absl::string_view::npos || sp2 == absl::string_view::npos ||
      line.find(' ', sp2 + 1) != absl::string_view::npos) {
    *h = Error(400, "malformed request line");
    return false;
  }
  absl::string_view method = line.substr(0, sp1);
  absl::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  absl::string_view version = line.substr(sp2 + 1);
  if (method.empty() ||
      !std::all_of(method.begin(), method.end(), IsTokenChar)) {
    *h = Error(400, "malformed method");
    return false;
  }
  if (target.empty() || target[0] != '/') {
    *h = Error(400, "the request target must be a path starting with /");
    return false;
  }
  for (char c : target) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7f) {
      *h = Error(400, "bad byte in request target");
      return false;
    }
  }
  if (!absl::StartsWith(version, "HTTP/") || version.size() != 8 ||
      version[6] != '.' ||
      !absl::ascii_isdigit(static_cast<unsigned char>(version[5])) ||
      !absl::ascii_isdigit(static_cast<unsigned char>(version[7]))) {
    *h = Error(400, "malformed HTTP version");
    return false;
  }
  if (version[5] != '1') {
    *h = Error(505, "only HTTP/1.x is served");
    return false;
  }
  h->minor_version = version[7] - '0';
  h->method = std::string(method);
  h->target = std::string(target.substr(0, target.find('?')));
  return true;
}

// One header line: a token name, a colon, a value without control bytes;
// no folding and no body. False with `*err` the error to answer.
bool CheckHeaderLine(absl::string_view line, HttpHead* err) {
  if (line[0] == ' ' || line[0] == '\t') {
    *err = Error(400, "obsolete header line folding");
    return false;
  }
  size_t colon = line.find(':');
  if (colon == 0 || colon == absl::string_view::npos) {
    *err = Error(400, "malformed header line");
    return false;
  }
  absl::string_view name = line.substr(0, colon);
  if (!std::all_of(name.begin(), name.end(), IsTokenChar)) {
    *err = Error(400, "malformed header name");
    return false;
  }
  absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
  for (char c : value) {
    unsigned char u = static_cast<unsigned char>(c);
    if ((u < 0x20 && u != '\t') || u == 0x7f) {
      *err = Error(400, "control byte in a header value");
      return false;
    }
  }
  if (absl::EqualsIgnoreCase(name, "transfer-encoding") ||
      (absl::EqualsIgnoreCase(name, "content-length") && value != "0")) {
    *err = Error(400, "a request body is not accepted here");
    return false;
  }
  return true;
}

}  // namespace

HttpHead ParseHttpHead(absl::string_view buf, size_t max_bytes) {
  // The head ends at the first empty line; look only within the limit.
  absl::string_view window = buf.substr(0, max_bytes);
  absl::string_view rest = window;
  absl::string_view line;
  if (!NextLine(&rest, &line)) {
    // No request line has such bytes (a TLS hello, binary noise): refuse
    // now rather than wait for a line end that may never come.
    for (char c : window) {
      unsigned char u = static_cast<unsigned char>(c);
      if ((u < 0x20 && c != '\r') || u >= 0x7f) {
        return Error(400, "not an HTTP/1.x request");
      }
    }
    if (buf.size() >= max_bytes) {
      return Error(
          431, absl::StrCat("request line longer than ", max_bytes, " bytes"));
    }
    return HttpHead{};
  }
  HttpHead h;
  if (!ParseRequestLine(line, &h)) return h;
  for (;;) {
    if (!NextLine(&rest, &line)) {
      if (buf.size() >= max_bytes) {
        return Error(431, absl::StrCat("request head longer than ", max_bytes,
                                       " bytes"));
      }
      return HttpHead{};
    }
    if (line.empty()) break;
    HttpHead err;
    if (!CheckHeaderLine(line, &err)) return err;
  }
  h.state = HttpHead::State::kComplete;
  h.head_bytes = window.size() - rest.size();
  return h;
}

int RouteMetricsRequest(const HttpHead& head) {
  if (head.method != "GET" && head.method != "HEAD") return 405;
  return head.target == "/metrics" ? 200 : 404;
}

}  // namespace kreg
