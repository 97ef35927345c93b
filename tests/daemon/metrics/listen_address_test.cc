#include "daemon/metrics/listen_address.h"

#include <string>

#include "catch2/catch.hpp"

namespace kreg {
namespace {

std::string Error(const std::string& text, bool allow_remote = false) {
  absl::StatusOr<MetricsAddress> a = ParseMetricsAddress(text, allow_remote);
  REQUIRE_FALSE(a.ok());
  CHECK(a.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(a.status().message());
}

TEST_CASE("Loopback TCP and unix: addresses parse", "[metrics]") {
  absl::StatusOr<MetricsAddress> a =
      ParseMetricsAddress("127.0.0.1:9464", false);
  REQUIRE(a.ok());
  CHECK(a->kind == MetricsAddress::Kind::kTcp4);
  CHECK(a->host == "127.0.0.1");
  CHECK(a->port == 9464);
  CHECK(a->loopback);
  CHECK(a->ToString() == "127.0.0.1:9464");

  a = ParseMetricsAddress("127.1.2.3:1", false);
  REQUIRE(a.ok());
  CHECK(a->loopback);

  a = ParseMetricsAddress("[::1]:65535", false);
  REQUIRE(a.ok());
  CHECK(a->kind == MetricsAddress::Kind::kTcp6);
  CHECK(a->port == 65535);
  CHECK(a->ToString() == "[::1]:65535");

  a = ParseMetricsAddress("unix:/run/kregd/metrics.sock", false);
  REQUIRE(a.ok());
  CHECK(a->kind == MetricsAddress::Kind::kUnix);
  CHECK(a->path == "/run/kregd/metrics.sock");
  CHECK(a->ToString() == "unix:/run/kregd/metrics.sock");
}

TEST_CASE("Bad ports are refused with the value", "[metrics]") {
  CHECK_THAT(Error("127.0.0.1:0"),
             Catch::Contains("\"0\" is not a number from 1 to 65535"));
  CHECK_THAT(Error("127.0.0.1:65536"), Catch::Contains("65536"));
  CHECK_THAT(Error("127.0.0.1:http"), Catch::Contains("\"http\""));
  CHECK_THAT(Error("127.0.0.1:"), Catch::Contains("port"));
  CHECK_THAT(Error("127.0.0.1:-1"), Catch::Contains("\"-1\""));
  CHECK_THAT(Error("127.0.0.1:+80"), Catch::Contains("\"+80\""));
  CHECK_THAT(Error("127.0.0.1:0000080"), Catch::Contains("0000080"));
}

TEST_CASE("Unparseable addresses are refused with what to write", "[metrics]") {
  CHECK_THAT(Error(""), Catch::Contains("empty address"));
  CHECK_THAT(Error("garbage"), Catch::Contains("\"garbage\""));
  CHECK_THAT(Error("garbage"), Catch::Contains("unix:/absolute/path"));
  CHECK_THAT(Error("localhost:9464"), Catch::Contains("not resolved"));
  CHECK_THAT(Error("::1:9464"), Catch::Contains("brackets"));
  CHECK_THAT(Error("[::1]9464"), Catch::Contains("[IPv6]:PORT"));
  CHECK_THAT(Error("[nonsense]:80"), Catch::Contains("not an IPv6 address"));
  CHECK_THAT(Error("unix:relative.sock"), Catch::Contains("absolute"));
  CHECK_THAT(Error("unix:"), Catch::Contains("absolute"));
  CHECK_THAT(Error("unix:/" + std::string(200, 'a')),
             Catch::Contains("at most"));
  CHECK_THAT(Error(std::string("unix:/a\0b", 9)), Catch::Contains("NUL"));
  // Control bytes are quoted escaped, not written raw to the terminal.
  CHECK_THAT(Error("\x1b[31m:80"), Catch::Contains("\\x1b"));
}

TEST_CASE("Non-loopback addresses need the explicit opt-in", "[metrics]") {
  CHECK_THAT(Error("0.0.0.0:9464"), Catch::Contains("metrics_allow_remote"));
  CHECK_THAT(Error("10.1.2.3:9464"), Catch::Contains("not a loopback"));
  CHECK_THAT(Error("[::]:9464"), Catch::Contains("metrics_allow_remote"));
  absl::StatusOr<MetricsAddress> a = ParseMetricsAddress("0.0.0.0:9464", true);
  REQUIRE(a.ok());
  CHECK_FALSE(a->loopback);
  a = ParseMetricsAddress("[::]:9464", true);
  REQUIRE(a.ok());
  CHECK_FALSE(a->loopback);
}

}  // namespace
}  // namespace kreg
