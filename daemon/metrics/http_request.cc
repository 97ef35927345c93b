#include "daemon/metrics/http_request.h"

#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "boost/asio/buffer.hpp"
#include "boost/beast/http.hpp"

namespace kreg {
namespace {

namespace http = boost::beast::http;

std::string Refuse(int status, absl::string_view why) {
  return HttpResponse(status, absl::StrCat(why, "\n"), false);
}

// Whether the request line of `head` names an HTTP version with a major
// other than 1 ("HTTP/2.0"), which Beast calls a bad version: 505, not 400.
bool OtherHttpMajor(absl::string_view head) {
  absl::string_view line = head.substr(0, head.find_first_of("\r\n"));
  size_t sp1 = line.find(' ');
  size_t sp2 = sp1 == line.npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == line.npos) return false;
  absl::string_view version = line.substr(sp2 + 1);
  return absl::StartsWith(version, "HTTP/") && version.size() > 5 &&
         absl::ascii_isdigit(static_cast<unsigned char>(version[5])) &&
         version[5] != '1';
}

}  // namespace

std::optional<std::string> AnswerMetricsRequest(
    absl::string_view in, size_t max_bytes,
    const std::function<std::string()>& render) {
  // Beast refuses what it has seen to be wrong as soon as it sees it (a TLS
  // hello at its first byte), and waits for the rest otherwise.
  const absl::string_view head = in.substr(0, max_bytes);
  http::request_parser<http::empty_body> parser;
  parser.header_limit(static_cast<uint32_t>(max_bytes));
  boost::beast::error_code ec;
  parser.put(boost::asio::buffer(head.data(), head.size()), ec);
  if (ec == http::error::need_more && in.size() < max_bytes) {
    return std::nullopt;
  }
  if (ec == http::error::need_more || ec == http::error::header_limit) {
    return Refuse(
        431, absl::StrCat("request head longer than ", max_bytes, " bytes"));
  }
  if (ec == http::error::bad_version && OtherHttpMajor(head)) {
    return Refuse(505, "only HTTP/1.x is served");
  }
  if (ec) {
    return Refuse(
        400, absl::StrCat("not an HTTP/1.x request head (", ec.message(), ")"));
  }
  const http::request<http::empty_body>& req = parser.get();
  absl::string_view target(req.target().data(), req.target().size());
  if (!absl::StartsWith(target, "/")) {
    return Refuse(400, "the request target must be a path starting with /");
  }
  if (req.count(http::field::transfer_encoding) != 0 ||
      parser.content_length().value_or(0) != 0) {
    return Refuse(400, "a request body is not accepted here");
  }
  const bool head_only = req.method() == http::verb::head;
  if (!head_only && req.method() != http::verb::get) {
    return HttpResponse(405, "only GET and HEAD are served\n", false);
  }
  if (target.substr(0, target.find('?')) != "/metrics") {
    return HttpResponse(404, "kregd serves only /metrics here\n", head_only);
  }
  return HttpResponse(200, render(), head_only);
}

std::string HttpResponse(int status, const std::string& body, bool head_only) {
  http::response<http::string_body> res(static_cast<http::status>(status), 11,
                                        body);
  res.set(http::field::content_type,
          status == 200 ? "text/plain; version=0.0.4; charset=utf-8"
                        : "text/plain; charset=utf-8");
  if (status == 405) res.set(http::field::allow, "GET, HEAD");
  res.content_length(body.size());
  res.keep_alive(false);
  std::ostringstream out;
  if (head_only) {
    out << res.base();
  } else {
    out << res;
  }
  return out.str();
}

}  // namespace kreg
