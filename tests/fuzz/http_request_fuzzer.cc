// Fuzzes the request-head parser of kregd's metrics endpoint
// (daemon/metrics/http_request.cc): anybody who can connect to
// metrics_listen sends these bytes. Every input must get a definite verdict
// within the limit; a complete head must lie inside the input and the
// limit and route to 200, 404 or 405; an error must carry a status the
// server answers; and the verdict must agree with the verdicts on prefixes
// of the input (what the server sees as bytes arrive): a prefix of a
// complete head is incomplete, and a refused prefix stays refused.
//
// Input: byte 0 picks the head limit (16 + 32 * byte, so the 431 path is
// reached); the rest is what the client sent.
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/metrics/http_request.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using kreg::HttpHead;
using kreg::fuzz::Fail;

void Check(const HttpHead& h, size_t size, size_t max) {
  switch (h.state) {
    case HttpHead::State::kIncomplete:
      if (size >= max) Fail("incomplete at or beyond the limit");
      break;
    case HttpHead::State::kComplete: {
      if (h.head_bytes == 0 || h.head_bytes > size || h.head_bytes > max) {
        Fail(absl::StrCat("head of ", h.head_bytes, " bytes in ", size,
                          " (limit ", max, ")"));
      }
      int route = kreg::RouteMetricsRequest(h);
      if (route != 200 && route != 404 && route != 405) Fail("bad route");
      if (h.method.empty() || h.target.empty()) Fail("empty method/target");
      break;
    }
    case HttpHead::State::kError:
      if (h.status != 400 && h.status != 431 && h.status != 505) {
        Fail(absl::StrCat("error status ", h.status));
      }
      if (h.reason.empty()) Fail("error without a reason");
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t max = 16 + 32 * size_t{data[0]};
  std::string buf(reinterpret_cast<const char*>(data) + 1, size - 1);
  HttpHead full = kreg::ParseHttpHead(buf, max);
  Check(full, buf.size(), max);
  for (size_t cut : {size_t{0}, buf.size() / 4, buf.size() / 2,
                     buf.size() * 3 / 4, buf.size() ? buf.size() - 1 : 0}) {
    if (cut >= buf.size()) continue;
    HttpHead part = kreg::ParseHttpHead(buf.substr(0, cut), max);
    Check(part, cut, max);
    if (part.state == HttpHead::State::kError &&
        full.state != HttpHead::State::kError) {
      Fail(absl::StrCat("prefix of ", cut, " bytes refused (", part.reason,
                        ") but the whole input is not"));
    }
    if (full.state == HttpHead::State::kComplete &&
        part.state == HttpHead::State::kComplete &&
        part.head_bytes != full.head_bytes) {
      Fail("a prefix completes a different head");
    }
  }
  return 0;
}
