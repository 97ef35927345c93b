// The mapping between absl::Status and the protocol's SessionStatus
// (daemon/base/served_session.h).
#include "daemon/base/served_session.h"

#include <string>

#include "absl/status/status.h"
#include "catch2/catch.hpp"
#include "kreg/v1/session.pb.h"

namespace kreg {
namespace {

TEST_CASE("A status crosses the wire and back unchanged", "[wire_status]") {
  v1::SessionStatus wire;
  ToWireStatus(absl::NotFoundError("no \"my_op\" (cpu)"), &wire);
  CHECK(wire.code() == 5);
  CHECK(wire.message() == "no \"my_op\" (cpu)");
  const absl::Status back = FromWireStatus(wire);
  CHECK(back.code() == absl::StatusCode::kNotFound);
  CHECK(back.message() == "no \"my_op\" (cpu)");

  ToWireStatus(absl::OkStatus(), &wire);
  CHECK(wire.code() == 0);
  CHECK(FromWireStatus(wire).ok());
}

TEST_CASE("A code absl does not know reads as UNKNOWN, message kept",
          "[wire_status]") {
  for (int code : {-1, 17, 1000}) {
    v1::SessionStatus wire;
    wire.set_code(code);
    wire.set_message("odd peer");
    const absl::Status s = FromWireStatus(wire);
    CHECK(s.code() == absl::StatusCode::kUnknown);
    CHECK(s.message() == "odd peer");
  }
}

}  // namespace
}  // namespace kreg
