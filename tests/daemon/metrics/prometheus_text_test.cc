#include "daemon/metrics/prometheus_text.h"

#include <cmath>
#include <limits>

#include "catch2/catch.hpp"

namespace kreg {
namespace {

TEST_CASE("Label values escape backslash, quote and newline only",
          "[metrics]") {
  CHECK(EscapeLabelValue("plain.name:v1-x") == "plain.name:v1-x");
  CHECK(EscapeLabelValue("a\\b") == "a\\\\b");
  CHECK(EscapeLabelValue("say \"hi\"") == "say \\\"hi\\\"");
  CHECK(EscapeLabelValue("two\nlines") == "two\\nlines");
  CHECK(EscapeLabelValue("tab\tstays") == "tab\tstays");
  CHECK(EscapeHelp("a\\b\nc \"q\"") == "a\\\\b\\nc \"q\"");
}

TEST_CASE("Numbers are written the way Prometheus reads them", "[metrics]") {
  CHECK(PromNumber(0) == "0");
  CHECK(PromNumber(42) == "42");
  CHECK(PromNumber(-3) == "-3");
  CHECK(PromNumber(5e-7) == "5e-07");
  CHECK(PromNumber(0.1) == "0.1");
  CHECK(PromNumber(std::numeric_limits<double>::infinity()) == "+Inf");
  CHECK(PromNumber(-std::numeric_limits<double>::infinity()) == "-Inf");
  CHECK(PromNumber(std::nan("")) == "NaN");
  CHECK(std::stod(PromNumber(1.0 / 3)) == 1.0 / 3);
}

TEST_CASE("A family is HELP and TYPE, then its samples", "[metrics]") {
  PromWriter w;
  w.Family("kregd_x_total", "counter", "calls of\na \"target\"");
  w.Sample("kregd_x_total", {{"target", "a\"b"}, {"platform", "cpu"}},
           uint64_t{18446744073709551615u});
  w.Sample("kregd_x_total", {}, 1.5);
  CHECK(w.text() ==
        "# HELP kregd_x_total calls of\\na \"target\"\n"
        "# TYPE kregd_x_total counter\n"
        "kregd_x_total{target=\"a\\\"b\",platform=\"cpu\"} "
        "18446744073709551615\n"
        "kregd_x_total 1.5\n");
}

}  // namespace
}  // namespace kreg
