#include "daemon/registry/module_loader.h"

#include "catch2/catch.hpp"
#include "daemon/base/hosted_api.h"

namespace kreg {
namespace {

TEST_CASE("CheckHostable accepts the hosted and older minor versions",
          "[loader]") {
  HandlerInfo same{kHostedApiMajor, kHostedApiMinor, 0, 0};
  CHECK(CheckHostable(same, "Scale").ok());
  HandlerInfo older{kHostedApiMajor, 0, 0, 0};
  CHECK(CheckHostable(older, "Scale").ok());
}

TEST_CASE("CheckHostable refuses a newer minor with both versions",
          "[loader]") {
  HandlerInfo newer{kHostedApiMajor, kHostedApiMinor + 1, 0, 0};
  absl::Status st = CheckHostable(newer, "Scale");
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(st.message()),
             Catch::Contains("\"Scale\"") && Catch::Contains("API 0.5") &&
                 Catch::Contains("the 0.4 that kregd hosts"));
}

TEST_CASE("CheckHostable refuses another major version", "[loader]") {
  HandlerInfo major{kHostedApiMajor + 1, 0, 0, 0};
  CHECK_THAT(std::string(CheckHostable(major, "Op").message()),
             Catch::Contains("API 1.0"));
}

TEST_CASE("CheckHostable refuses state outside a bundle's instantiate stage",
          "[loader]") {
  HandlerInfo stateful{kHostedApiMajor, kHostedApiMinor, 0, 7};
  absl::Status st = CheckHostable(stateful, "Stateful");
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(st.message()),
             Catch::Contains("state type id 7") &&
                 Catch::Contains("instantiate=Stateful;execute=SYMBOL"));
  CHECK(CheckHostable(stateful, "instantiate=Stateful;execute=E",
                      /*has_instantiate=*/true)
            .ok());
}

TEST_CASE("ProbeHandler reports a helper that cannot be started", "[loader]") {
  auto info = ProbeHandler("/nonexistent/kregd-probe", "/x.so", "x", "S", 20);
  REQUIRE(info.status().code() == absl::StatusCode::kInternal);
  CHECK_THAT(std::string(info.status().message()),
             Catch::Contains("cannot start the probe helper "
                             "/nonexistent/kregd-probe"));
}

}  // namespace
}  // namespace kreg
