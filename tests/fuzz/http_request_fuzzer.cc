// Fuzzes the request handling of kregd's metrics endpoint
// (daemon/metrics/http_request.cc: Boost.Beast's parser and kregd's
// checks and routing around it): anybody who can connect to metrics_listen
// sends these bytes. Every input must get a definite answer within the
// limit: a complete HTTP/1.1 response with a status the endpoint documents
// (the body rendered only for a 200), Content-Length matching the body
// (HEAD aside); and the answers must agree with the answers on prefixes of
// the input (what the server sees as bytes arrive): a prefix that is
// answered gets the whole input's answer.
//
// Input: byte 0 picks the head limit (16 + 32 * byte, so the 431 path is
// reached); the rest is what the client sent.
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/metrics/http_request.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using kreg::fuzz::Fail;

std::optional<std::string> Answer(const std::string& in, size_t max) {
  bool rendered = false;
  std::optional<std::string> r = kreg::AnswerMetricsRequest(in, max, [&] {
    rendered = true;
    return std::string("kregd_up 1\n");
  });
  if (!r.has_value()) {
    if (in.size() >= max) Fail("no answer at or beyond the limit");
    return r;
  }
  int status = 0;
  if (r->rfind("HTTP/1.1 ", 0) != 0 ||
      !absl::SimpleAtoi(r->substr(9, 3), &status)) {
    Fail("not an HTTP/1.1 status line: " + r->substr(0, 40));
  }
  switch (status) {
    case 200:
    case 404:
    case 405:
    case 400:
    case 431:
    case 505:
      break;
    default:
      Fail(absl::StrCat("status ", status));
  }
  if (rendered != (status == 200)) Fail(absl::StrCat("rendered for ", status));
  const size_t end = r->find("\r\n\r\n");
  if (end == std::string::npos) Fail("no end of the response head");
  // Every answer has a body; HEAD leaves it out but gives its length.
  const size_t body = end + 4;
  const size_t field = r->find("\r\nContent-Length: ");
  const size_t at = field + 18;
  size_t length = 0;
  if (field == std::string::npos || at > end ||
      !absl::SimpleAtoi(r->substr(at, r->find('\r', at) - at), &length) ||
      length == 0 || (r->size() > body && r->size() - body != length)) {
    Fail("Content-Length does not match the body: " + *r);
  }
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t max = 16 + 32 * size_t{data[0]};
  std::string in(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::optional<std::string> full = Answer(in, max);
  for (size_t cut : {size_t{0}, in.size() / 4, in.size() / 2, in.size() * 3 / 4,
                     in.size() ? in.size() - 1 : 0}) {
    if (cut >= in.size()) continue;
    std::optional<std::string> part = Answer(in.substr(0, cut), max);
    if (part.has_value() && part != full) {
      Fail(absl::StrCat(
          "a prefix of ", cut, " bytes is answered \"",
          part->substr(0, part->find('\r')), "\" but the whole input ",
          full ? "\"" + full->substr(0, full->find('\r')) + "\"" : "not yet"));
    }
  }
  return 0;
}
