// The session protocol's negotiation rule (common/session_protocol.h): same
// major, the lower minor; another major is refused with both versions, the
// older side and what to do.
#include "common/session_protocol.h"

#include <string>

#include "catch2/catch.hpp"

namespace kreg {
namespace {

TEST_CASE("Equal majors agree on the lower minor", "[session_protocol]") {
  uint32_t minor = 99;
  std::string refusal;
  REQUIRE(NegotiateSessionProtocol({2, 0}, {2, 0}, &minor, &refusal));
  CHECK(minor == 0);
  REQUIRE(NegotiateSessionProtocol({2, 3}, {2, 1}, &minor, &refusal));
  CHECK(minor == 1);
  REQUIRE(NegotiateSessionProtocol({2, 1}, {2, 4}, &minor, &refusal));
  CHECK(minor == 1);
  CHECK(refusal.empty());
}

TEST_CASE("Another major is refused, naming the older side",
          "[session_protocol]") {
  uint32_t minor = 7;
  std::string refusal;
  REQUIRE_FALSE(NegotiateSessionProtocol({2, 0}, {1, 8}, &minor, &refusal));
  CHECK(minor == 7);
  CHECK(refusal ==
        "the client library speaks session protocol 1.8 and kregd 2.0: the "
        "client library is older. Update the client library (the kreg "
        "wheel) so that both are from the same release");
  REQUIRE_FALSE(NegotiateSessionProtocol({2, 5}, {3, 0}, &minor, &refusal));
  CHECK(refusal ==
        "the client library speaks session protocol 3.0 and kregd 2.5: kregd "
        "is older. Update kregd so that both are from the same release");
}

TEST_CASE("This build speaks 2.0", "[session_protocol]") {
  CHECK(kSessionProtocolMajor == 2);
  CHECK(kSessionProtocolMinor == 0);
}

}  // namespace
}  // namespace kreg
