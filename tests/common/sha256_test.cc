#include "common/sha256.h"

#include <string>

#include "catch2/catch.hpp"

namespace kreg {
namespace {

TEST_CASE("Sha256Hex matches the FIPS 180-4 examples", "[sha256]") {
  CHECK(Sha256Hex("", 0) ==
        "sha256:"
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(Sha256Hex("abc", 3) ==
        "sha256:"
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string two_blocks =
      "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  CHECK(Sha256Hex(two_blocks.data(), two_blocks.size()) ==
        "sha256:"
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST_CASE("FinalHex is the digest in lowercase hex, fed in pieces",
          "[sha256]") {
  Sha256 h;
  h.Update("a", 1);
  h.Update("bc", 2);
  CHECK(h.FinalHex() ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

}  // namespace
}  // namespace kreg
