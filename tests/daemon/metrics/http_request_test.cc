#include "daemon/metrics/http_request.h"

#include <string>

#include "catch2/catch.hpp"

namespace kreg {
namespace {

using State = HttpHead::State;

HttpHead Parse(const std::string& text, size_t max = kMaxHttpHeadBytes) {
  return ParseHttpHead(text, max);
}

TEST_CASE("A GET head parses and routes", "[http]") {
  std::string req =
      "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: text/plain\r\n\r\n";
  HttpHead h = Parse(req + "trailing");
  REQUIRE(h.state == State::kComplete);
  CHECK(h.method == "GET");
  CHECK(h.target == "/metrics");
  CHECK(h.minor_version == 1);
  CHECK(h.head_bytes == req.size());
  CHECK(RouteMetricsRequest(h) == 200);

  h = Parse("HEAD /metrics?name[]=x HTTP/1.0\n\n");  // bare LF, a query
  REQUIRE(h.state == State::kComplete);
  CHECK(h.target == "/metrics");
  CHECK(RouteMetricsRequest(h) == 200);

  CHECK(RouteMetricsRequest(Parse("GET / HTTP/1.1\r\n\r\n")) == 404);
  CHECK(RouteMetricsRequest(Parse("GET /metrics/ HTTP/1.1\r\n\r\n")) == 404);
  CHECK(RouteMetricsRequest(Parse("POST /metrics HTTP/1.1\r\n\r\n")) == 405);
  CHECK(RouteMetricsRequest(Parse("get /metrics HTTP/1.1\r\n\r\n")) == 405);
}

TEST_CASE("An unfinished head asks for more", "[http]") {
  CHECK(Parse("").state == State::kIncomplete);
  CHECK(Parse("GET /metrics HT").state == State::kIncomplete);
  CHECK(Parse("GET /metrics HTTP/1.1\r\nHost: x\r\n").state ==
        State::kIncomplete);
}

TEST_CASE("Binary noise is refused before a line end arrives", "[http]") {
  const char tls[] = "\x16\x03\x01\x02\x00\x01";
  HttpHead h = Parse(std::string(tls, sizeof(tls) - 1));
  REQUIRE(h.state == State::kError);
  CHECK(h.status == 400);
  CHECK(h.reason == "not an HTTP/1.x request");
  CHECK(Parse("GET /m\xc3\xa9").status == 400);
  CHECK(Parse("GET /metrics HTTP/1.1\r").state == State::kIncomplete);
}

TEST_CASE("Oversized heads are refused with 431", "[http]") {
  HttpHead h = Parse(std::string(100, 'G'), 64);
  REQUIRE(h.state == State::kError);
  CHECK(h.status == 431);
  CHECK_THAT(h.reason, Catch::Contains("64 bytes"));

  std::string many = "GET /metrics HTTP/1.1\r\n";
  while (many.size() < 200) many += "X-Pad: aaaaaaaa\r\n";
  h = Parse(many, 128);
  REQUIRE(h.state == State::kError);
  CHECK(h.status == 431);
  // The same head within the limit is fine.
  CHECK(Parse(many + "\r\n", 4096).state == State::kComplete);
}

TEST_CASE("Malformed heads are refused with 400 and why", "[http]") {
  auto status = [](const std::string& text) {
    HttpHead h = ParseHttpHead(text);
    REQUIRE(h.state == State::kError);
    return std::make_pair(h.status, h.reason);
  };
  CHECK(status("GET\r\n\r\n").first == 400);
  CHECK(status("GET /metrics\r\n\r\n").first == 400);
  CHECK(status("GET  /metrics HTTP/1.1\r\n\r\n").first == 400);
  CHECK(status("GET /metrics HTTP/1.1 extra\r\n\r\n").first == 400);
  // Found by http_request_fuzzer: a target that is only a query.
  CHECK_THAT(status("GET ?metrics HTTP/1.1\r\n\r\n").second,
             Catch::Contains("starting with /"));
  CHECK(status("GET http://x/metrics HTTP/1.1\r\n\r\n").first == 400);
  CHECK(status("G@T /metrics HTTP/1.1\r\n\r\n").second == "malformed method");
  CHECK(status("GET /me\x01trics HTTP/1.1\r\n\r\n").second ==
        "bad byte in request target");
}

TEST_CASE("Bad versions, headers and bodies are refused", "[http]") {
  HttpHead h = Parse("GET /metrics HTTP/2.0\r\n\r\n");
  CHECK(h.status == 505);
  h = Parse("GET /metrics HTTPS/1.1\r\n\r\n");
  CHECK(h.status == 400);
  h = Parse("GET /metrics HTTP/1.10\r\n\r\n");
  CHECK(h.status == 400);
  h = Parse("GET /metrics HTTP/1.1\r\nNoColon\r\n\r\n");
  CHECK(h.reason == "malformed header line");
  h = Parse("GET /metrics HTTP/1.1\r\n: empty name\r\n\r\n");
  CHECK(h.reason == "malformed header line");
  h = Parse("GET /metrics HTTP/1.1\r\nBad Name: x\r\n\r\n");
  CHECK(h.reason == "malformed header name");
  h = Parse("GET /metrics HTTP/1.1\r\nA: b\r\n folded\r\n\r\n");
  CHECK(h.reason == "obsolete header line folding");
  h = Parse("GET /metrics HTTP/1.1\r\nA: b\x01\r\n\r\n");
  CHECK(h.reason == "control byte in a header value");
  h = Parse("GET /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello");
  CHECK(h.status == 400);
  CHECK_THAT(h.reason, Catch::Contains("body"));
  h = Parse("GET /metrics HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n");
  CHECK(h.status == 400);
  CHECK(Parse("GET /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n").state ==
        State::kComplete);
}

}  // namespace
}  // namespace kreg
