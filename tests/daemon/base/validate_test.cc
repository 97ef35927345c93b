#include "daemon/base/validate.h"

#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/platforms.h"

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

TEST_CASE("Reservations: patterns and owners", "[validate]") {
  auto user = ParseReservation("lib.*", "root");
  REQUIRE(user.ok());
  CHECK(user->pattern == "lib.*");
  CHECK_FALSE(user->group);
  CHECK(user->owner == 0);
  auto uid = ParseReservation("lib.op", "1234");
  REQUIRE(uid.ok());
  CHECK(uid->owner == 1234);
  auto group = ParseReservation("lib.*", "group:root");
  REQUIRE(group.ok());
  CHECK(group->group);
  CHECK(group->owner == 0);
  auto gid = ParseReservation("lib.*", "group:77");
  REQUIRE(gid.ok());
  CHECK((gid->group && gid->owner == 77));
  for (const auto& [pattern, owner, says] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"*", "root", "would reserve every name"},
           {"9lib.*", "root",
            "reservation pattern \"9lib.*\" is not a target name or a name "
            "prefix followed by '*': target name \"9lib.\" must start"},
           {"a*b", "root", "invalid character"},
           {"lib.*", "no-such-user-kreg",
            "reservation owner "
            "\"no-such-user-kreg\" is no user "
            "on this host"},
           {"lib.*", "group:no-such-group-kreg", "is no group on this host"},
           {"lib.*", "", "reservation owner \"\" is no user"},
           {"lib.*", "group:", "is no group"},
       }) {
    auto r = ParseReservation(pattern, owner);
    INFO(pattern << " " << owner);
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(r.status().message()), Catch::Contains(says));
  }
}

TEST_CASE("Platforms: canonical names and aliases", "[validate]") {
  CHECK(*ParsePlatform("cpu") == Platform::kCpu);
  CHECK(*ParsePlatform("Host") == Platform::kCpu);
  CHECK(*ParsePlatform("CUDA") == Platform::kCuda);
  CHECK(*ParsePlatform("gpu") == Platform::kCuda);
}

TEST_CASE("Platforms: every row of the table parses and names itself",
          "[validate]") {
  for (size_t i = 0; i < kNumPlatforms; ++i) {
    const Platform p = static_cast<Platform>(i);
    CHECK(*ParsePlatform(kPlatforms[i].name) == p);
    CHECK(*ParsePlatform(kPlatforms[i].alias) == p);
    CHECK(std::string(PlatformName(p)) == kPlatforms[i].name);
  }
  CHECK(std::string(PlatformName(static_cast<Platform>(kNumPlatforms))) == "?");
  CHECK(PlatformChoices() ==
        "\"cpu\" (alias \"host\") or \"cuda\" (alias "
        "\"gpu\")");
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

TEST_CASE("A client's content_id may not start with the compile prefix",
          "[validate]") {
  CHECK(ValidateContentId("kcc-sha256:00").ok());  // the service's own
  CHECK(ValidateClientContentId("cache:kcc-1").ok());
  CHECK_FALSE(ValidateClientContentId("has space").ok());
  for (const char* id : {"kcc-sha256:00", "KCC-x", "kcc-"}) {
    absl::Status s = ValidateClientContentId(id);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(Message(s) == absl::StrCat("content_id \"", id,
                                     "\" starts with \"kcc-\", which is "
                                     "reserved for modules kregd compiled "
                                     "itself (kreg.compile_ffi_target, kregctl "
                                     "compile); use another content_id, or "
                                     "have kregd compile the sources"));
  }
}

TEST_CASE("UTF-8: well-formed passes, malformed is caught", "[validate]") {
  for (const char* ok : {"", "plain", "caf\xc3\xa9", "\xe2\x82\xac",
                         "\xf0\x9f\x98\x80", "\xf4\x8f\xbf\xbf"}) {
    INFO(ok);
    CHECK(IsValidUtf8(ok));
  }
  for (const char* bad :
       {"\xff", "\x80", "caf\xc3", "\xc0\xaf" /* overlong */,
        "\xed\xa0\x80" /* surrogate */, "\xf4\x90\x80\x80" /* > 10FFFF */,
        "\xe2\x82", "a\xe2\x28\xa1"}) {
    INFO(QuoteForMessage(bad));
    CHECK_FALSE(IsValidUtf8(bad));
  }
}

TEST_CASE("Module paths: NUL, relative, too long, bad UTF-8 are refused",
          "[validate]") {
  CHECK(ValidateModulePath("/srv/kernels/libdemo.so").ok());
  absl::Status nul =
      ValidateModulePath(std::string("/srv/libdemo.so\0/../../etc/x", 28));
  CHECK(nul.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(Message(nul), Catch::Contains("\"/srv/libdemo.so\\x00/../..") &&
                               Catch::Contains("NUL byte at position 15") &&
                               Catch::Contains("refused, not cut"));
  CHECK_THAT(Message(ValidateModulePath("")), Catch::Contains("empty"));
  CHECK_THAT(Message(ValidateModulePath("lib/x.so")),
             Catch::Contains("\"lib/x.so\" is not absolute"));
  CHECK_THAT(Message(ValidateModulePath("/" + std::string(5000, 'a'))),
             Catch::Contains("5001 bytes long; the limit is 4095"));
  CHECK_THAT(Message(ValidateModulePath("/srv/\xff.so")),
             Catch::Contains("\"/srv/\\xff.so\" is not valid UTF-8"));
  CHECK(ValidateModulePath("/srv/caf\xc3\xa9.so").ok());
}

TEST_CASE("Upload chunks above 4 MiB are refused with their size",
          "[validate]") {
  CHECK(ValidateUploadChunk(4u << 20, 1).ok());
  absl::Status big = ValidateUploadChunk((5u << 20), 3);
  CHECK(big.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(Message(big), Catch::Contains("upload chunk 3 carries 5242880 "
                                           "bytes") &&
                               Catch::Contains("at most 4194304"));
}

TEST_CASE("Module file names: at most 256 bytes, no NUL", "[validate]") {
  CHECK(ValidateModuleFileName("").ok());
  CHECK(ValidateModuleFileName("libdemo.so").ok());
  CHECK_THAT(Message(ValidateModuleFileName(std::string("a\0b", 3))),
             Catch::Contains("\"a\\x00b\""));
  CHECK_FALSE(ValidateModuleFileName(std::string(257, 'x')).ok());
}

}  // namespace
}  // namespace kreg
