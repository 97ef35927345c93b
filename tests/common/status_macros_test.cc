#include "common/status_macros.h"

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "catch2/catch.hpp"
#include "common/status.h"

namespace kreg {
namespace {

// Counts its calls, so a test sees the expression run once.
struct Step {
  int calls = 0;
  absl::Status Run(absl::Status s) {
    ++calls;
    return s;
  }
  absl::StatusOr<std::string> Value(absl::StatusOr<std::string> v) {
    ++calls;
    return v;
  }
  ClientStatus Client(ClientStatus s) {
    ++calls;
    return s;
  }
};

absl::Status TwoSteps(Step& step, absl::Status first, bool* reached_end) {
  KREG_RETURN_IF_ERROR(step.Run(first));
  KREG_RETURN_IF_ERROR(step.Run(absl::OkStatus()));
  *reached_end = true;
  return absl::OkStatus();
}

absl::StatusOr<size_t> Length(Step& step, absl::StatusOr<std::string> v) {
  KREG_ASSIGN_OR_RETURN(std::string text, step.Value(std::move(v)));
  return text.size();
}

ClientStatus ClientSteps(Step& step, ClientStatus first, bool* reached_end) {
  KREG_RETURN_IF_ERROR(step.Client(first));
  *reached_end = true;
  return ClientStatus::Ok();
}

TEST_CASE("KREG_RETURN_IF_ERROR returns the first error unchanged",
          "[status_macros]") {
  Step step;
  bool reached_end = false;
  absl::Status s =
      TwoSteps(step, absl::NotFoundError("no target 'x'"), &reached_end);
  CHECK(s == absl::NotFoundError("no target 'x'"));
  CHECK(step.calls == 1);
  CHECK_FALSE(reached_end);

  Step ok_step;
  CHECK(TwoSteps(ok_step, absl::OkStatus(), &reached_end).ok());
  CHECK(ok_step.calls == 2);
  CHECK(reached_end);
}

TEST_CASE("KREG_ASSIGN_OR_RETURN declares the value or returns the error",
          "[status_macros]") {
  Step step;
  absl::StatusOr<size_t> n = Length(step, std::string("four"));
  REQUIRE(n.ok());
  CHECK(*n == 4);
  CHECK(step.calls == 1);

  absl::StatusOr<size_t> bad =
      Length(step, absl::InvalidArgumentError("bad name"));
  CHECK(bad.status() == absl::InvalidArgumentError("bad name"));
  CHECK(step.calls == 2);
}

TEST_CASE("KREG_RETURN_IF_ERROR serves the shim's ClientStatus",
          "[status_macros]") {
  Step step;
  bool reached_end = false;
  ClientStatus s = ClientSteps(
      step, ClientStatus::Error(kUnavailable, "kregd is gone"), &reached_end);
  CHECK(s.code == kUnavailable);
  CHECK(s.message == "kregd is gone");
  CHECK(step.calls == 1);
  CHECK_FALSE(reached_end);

  CHECK(ClientSteps(step, ClientStatus::Ok(), &reached_end).ok());
  CHECK(reached_end);
}

}  // namespace
}  // namespace kreg
