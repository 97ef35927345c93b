#include "daemon/base/sha256.h"

#include <string>

#include "absl/strings/escaping.h"
#include "catch2/catch.hpp"

namespace kreg {
namespace {

TEST_CASE("Sha256Digest matches the FIPS 180-4 examples", "[sha256]") {
  CHECK(Sha256Digest("") ==
        "sha256:"
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(Sha256Digest("abc") ==
        "sha256:"
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

std::string Hex(const std::string& bytes) {
  return absl::BytesToHexString(bytes);
}

TEST_CASE("HmacSha256 matches RFC 4231's test cases", "[sha256][hmac]") {
  CHECK(Hex(HmacSha256(std::string(20, '\x0b'), "Hi There")) ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK(Hex(HmacSha256("Jefe", "what do ya want for nothing?")) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // A key longer than a block is hashed first.
  CHECK(Hex(HmacSha256(
            std::string(131, '\xaa'),
            "Test Using Larger Than Block-Size Key - Hash Key First")) ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

}  // namespace
}  // namespace kreg
