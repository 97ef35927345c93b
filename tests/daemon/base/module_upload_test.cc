#include "daemon/base/module_upload.h"

#include <fcntl.h>
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

// A memfd holding `bytes`, sealed with kModuleSeals.
UniqueFd SealedWith(const std::string& bytes) {
  UniqueFd fd(::memfd_create("test-module", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  REQUIRE(fd.ok());
  REQUIRE(::write(fd.get(), bytes.data(), bytes.size()) ==
          static_cast<ssize_t>(bytes.size()));
  REQUIRE(::fcntl(fd.get(), F_ADD_SEALS, kModuleSeals) == 0);
  return fd;
}

TEST_CASE("ReadSealedModule reads a sealed memfd of the announced size",
          "[module_upload]") {
  UniqueFd fd = SealedWith("module bytes");
  auto got = ReadSealedModule(fd.get(), 12, 1 << 20);
  REQUIRE(got.ok());
  CHECK(*got == "module bytes");
}

TEST_CASE("ReadSealedModule refuses what is not a sealed memfd of the size",
          "[module_upload]") {
  UniqueFd sealed = SealedWith("module bytes");
  // Unsealed: its bytes could change after kregd checked them.
  UniqueFd open_fd = MemfdWith("module bytes");
  auto s = ReadSealedModule(open_fd.get(), 12, 1 << 20).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message() ==
        "the module memfd attached to the upload is not sealed against "
        "writing, shrinking and growing (seals 0x1); seal it (F_SEAL_WRITE "
        "| F_SEAL_SHRINK | F_SEAL_GROW) before sending it");
  // Sealed, but of another size than announced.
  s = ReadSealedModule(sealed.get(), 11, 1 << 20).status();
  CHECK(s.message() ==
        "the module memfd attached to the upload holds 12 bytes, not the 11 "
        "announced in module.upload_size");
  // Not a memfd at all.
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  UniqueFd r(p[0]), w(p[1]);
  s = ReadSealedModule(r.get(), 12, 1 << 20).status();
  CHECK(s.message() ==
        "the file descriptor attached to the module upload is not a memfd; "
        "send the module as a memfd sealed against writing, shrinking and "
        "growing");
  // Over max_module_bytes or empty: refused before anything else.
  CHECK(ReadSealedModule(sealed.get(), 12, 11).status().message() ==
        "uploaded module of 12 bytes exceeds the limit of 11 bytes "
        "(max_module_bytes)");
  CHECK(ReadSealedModule(sealed.get(), 0, 11).status().message() ==
        "uploaded module is empty (0 bytes)");
}

TEST_CASE("ReadSealedModule refuses a sparse memfd before reading it",
          "[module_upload]") {
  // An ELF header and holes up to 8 MiB: free for the sender, a copy and
  // a hash of zeros for kregd.
  UniqueFd fd(::memfd_create("test-module", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  REQUIRE(fd.ok());
  REQUIRE(::write(fd.get(),
                  "\x7f"
                  "ELF",
                  4) == 4);
  REQUIRE(::ftruncate(fd.get(), 8 << 20) == 0);
  REQUIRE(::fcntl(fd.get(), F_ADD_SEALS, kModuleSeals) == 0);
  auto s = ReadSealedModule(fd.get(), 8 << 20, 16 << 20).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()),
             Catch::StartsWith("the module memfd attached to the upload is "
                               "sparse: only ") &&
                 Catch::EndsWith(" of its 8388608 bytes are written (the rest "
                                 "are holes); write the module's bytes into "
                                 "the memfd (a module is never sparse)"));
  // Written zeros are not holes.
  UniqueFd full = SealedWith(std::string(1 << 20, '\0'));
  CHECK(ReadSealedModule(full.get(), 1 << 20, 16 << 20).ok());
}

}  // namespace
}  // namespace kreg
