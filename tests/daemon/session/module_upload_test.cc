#include "daemon/session/module_upload.h"

#include <sys/mman.h>
#include <unistd.h>

#include <string>

#include "catch2/catch.hpp"
#include "common/unique_fd.h"

namespace kreg {
namespace {

UniqueFd MemfdWith(const std::string& bytes) {
  UniqueFd fd(::memfd_create("test-module", MFD_CLOEXEC));
  REQUIRE(fd.ok());
  REQUIRE(::write(fd.get(), bytes.data(), bytes.size()) ==
          static_cast<ssize_t>(bytes.size()));
  return fd;
}

TEST_CASE("ReadModuleFd reads the announced bytes from offset 0",
          "[module_upload]") {
  UniqueFd fd = MemfdWith(
      "\x7f"
      "ELF and more");
  auto got = ReadModuleFd(fd.get(), 4, 1 << 20);
  REQUIRE(got.ok());
  CHECK(*got ==
        "\x7f"
        "ELF");
}

TEST_CASE("ReadModuleFd refuses a size above max_module_bytes before reading",
          "[module_upload]") {
  UniqueFd fd = MemfdWith("0123456789");
  auto got = ReadModuleFd(fd.get(), 10, 9);
  REQUIRE(!got.ok());
  CHECK(got.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(got.status().message()).find("max_module_bytes") !=
        std::string::npos);
  CHECK(std::string(got.status().message()).find("10 bytes") !=
        std::string::npos);
}

TEST_CASE("ReadModuleFd refuses an fd shorter than announced",
          "[module_upload]") {
  UniqueFd fd = MemfdWith("short");
  auto got = ReadModuleFd(fd.get(), 100, 1 << 20);
  REQUIRE(!got.ok());
  CHECK(got.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(got.status().message()).find("holds 5") !=
        std::string::npos);
}

TEST_CASE("ReadModuleFd refuses an empty upload", "[module_upload]") {
  UniqueFd fd = MemfdWith("x");
  CHECK(ReadModuleFd(fd.get(), 0, 1 << 20).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kreg
