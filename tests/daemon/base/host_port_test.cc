#include "daemon/base/host_port.h"

#include <string>

#include "catch2/catch.hpp"

namespace kreg {
namespace {

std::string Error(const std::string& text) {
  absl::StatusOr<HostPort> hp = ParseHostPort(text);
  REQUIRE(hp.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(hp.status().message());
}

TEST_CASE("ParseHostPort splits host names, IPv4 and [IPv6]", "[host_port]") {
  absl::StatusOr<HostPort> hp = ParseHostPort("10.0.0.5:2379");
  REQUIRE(hp.ok());
  CHECK(hp->host == "10.0.0.5");
  CHECK(hp->port == 2379);
  CHECK_FALSE(hp->bracketed);
  hp = ParseHostPort("node-3.example.org:1");
  REQUIRE(hp.ok());
  CHECK(hp->host == "node-3.example.org");
  CHECK(hp->port == 1);
  hp = ParseHostPort("[fe80::1]:65535");
  REQUIRE(hp.ok());
  CHECK(hp->host == "fe80::1");
  CHECK(hp->port == 65535);
  CHECK(hp->bracketed);
}

TEST_CASE("ParseHostPort says what is wrong", "[host_port]") {
  CHECK(Error("") == "no :PORT");
  CHECK(Error("etcd") == "no :PORT");
  CHECK(Error(":80") == "empty host");
  CHECK(Error("[]:80") == "empty host");
  CHECK(Error("[::1]80") == "expected [IPv6]:PORT");
  CHECK(Error("[::1") == "expected [IPv6]:PORT");
  CHECK(Error("[::1]") == "expected [IPv6]:PORT");
  CHECK(Error("::1:80") == "an IPv6 address needs brackets: [::1]:PORT");
  CHECK(Error("a b:80") == "the host has a space, tab or '/'");
  CHECK(Error("a/b:80") == "the host has a space, tab or '/'");
}

TEST_CASE("ParseHostPort quotes a bad port", "[host_port]") {
  CHECK(Error("h:") == "port \"\" is not a number from 1 to 65535");
  CHECK(Error("[::1]:") == "port \"\" is not a number from 1 to 65535");
  CHECK(Error("h:0") == "port \"0\" is not a number from 1 to 65535");
  CHECK(Error("h:65536") == "port \"65536\" is not a number from 1 to 65535");
  CHECK(Error("h:http") == "port \"http\" is not a number from 1 to 65535");
  CHECK(Error("h:-1") == "port \"-1\" is not a number from 1 to 65535");
  CHECK(Error("h:+80") == "port \"+80\" is not a number from 1 to 65535");
  CHECK(Error("h:000080") == "port \"000080\" is not a number from 1 to 65535");
  CHECK(Error("h:2379/v3") ==
        "port \"2379/v3\" is not a number from 1 to 65535");
  CHECK(Error("h:\x1b") == "port \"\\x1b\" is not a number from 1 to 65535");
}

}  // namespace
}  // namespace kreg
