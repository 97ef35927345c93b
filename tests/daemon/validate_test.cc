#include "daemon/validate.h"

#include "catch2/catch.hpp"

namespace kreg {
namespace {

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST_CASE("Target names: valid ones pass", "[validate]") {
  for (const char* n : {"a", "_x", "demo.scale", "ns::op-v2", "A1_b.c:d-e"}) {
    CHECK(ValidateTargetName(n).ok());
  }
  CHECK(ValidateTargetName(std::string(256, 'a')).ok());
}

TEST_CASE("Target names: each bad form is refused with the name quoted",
          "[validate]") {
  CHECK_THAT(Message(ValidateTargetName("")), Catch::Contains("empty"));
  CHECK_THAT(
      Message(ValidateTargetName("9lives")),
      Catch::Contains("\"9lives\"") && Catch::Contains("start with a letter"));
  CHECK_THAT(Message(ValidateTargetName(".hidden")),
             Catch::Contains("start with a letter"));
  CHECK_THAT(Message(ValidateTargetName("has space")),
             Catch::Contains("\"has space\"") && Catch::Contains("position 3"));
  CHECK_THAT(Message(ValidateTargetName("a/b")), Catch::Contains("position 1"));
  CHECK_THAT(Message(ValidateTargetName(std::string("a\0b", 3))),
             Catch::Contains("\\x00"));
  CHECK_THAT(Message(ValidateTargetName(std::string(257, 'a'))),
             Catch::Contains("257 characters"));
  CHECK(ValidateTargetName("a b").code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("Platforms: canonical names and aliases", "[validate]") {
  CHECK(*ParsePlatform("cpu") == Platform::kCpu);
  CHECK(*ParsePlatform("Host") == Platform::kCpu);
  CHECK(*ParsePlatform("CUDA") == Platform::kCuda);
  CHECK(*ParsePlatform("gpu") == Platform::kCuda);
}

TEST_CASE("Platforms: unsupported and unknown are refused", "[validate]") {
  auto rocm = ParsePlatform("ROCm");
  CHECK(rocm.status().code() == absl::StatusCode::kUnimplemented);
  CHECK_THAT(Message(rocm.status()),
             Catch::Contains("\"ROCm\"") && Catch::Contains("not supported"));
  auto bad = ParsePlatform("fpga");
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(Message(bad.status()),
             Catch::Contains("unknown platform \"fpga\""));
  CHECK(ParsePlatform("").status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("Function names must be C symbols", "[validate]") {
  CHECK(ValidateFuncName("Scale_2").ok());
  CHECK_THAT(Message(ValidateFuncName("2x")), Catch::Contains("\"2x\""));
  CHECK_FALSE(ValidateFuncName("").ok());
  CHECK_FALSE(ValidateFuncName("a-b").ok());
}

TEST_CASE("Content ids are printable and bounded", "[validate]") {
  CHECK(ValidateContentId("").ok());
  CHECK(ValidateContentId("cache:abc123").ok());
  CHECK_THAT(Message(ValidateContentId("has space")),
             Catch::Contains("content_id \"has space\""));
  CHECK_FALSE(ValidateContentId(std::string(300, 'x')).ok());
}

}  // namespace
}  // namespace kreg
