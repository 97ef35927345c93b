#include "daemon/module_store.h"

#include <sys/stat.h>

#include <fstream>

#include "catch2/catch.hpp"
#include "tests/testing/temp_dir.h"

namespace kreg {
namespace {

TEST_CASE("Sha256Digest is the full digest", "[store]") {
  CHECK(Sha256Digest("") ==
        "sha256:"
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST_CASE("Put stores bytes under their digest, idempotently", "[store]") {
  testing::TempDir dir;
  ModuleStore store(dir.path() + "/modules");
  REQUIRE(store.Init().ok());
  const std::string digest = Sha256Digest("hello");
  REQUIRE(store.Put("hello", digest).ok());
  CHECK(store.PathOf(digest) ==
        dir.path() + "/modules/sha256-" + digest.substr(7) + ".so");
  CHECK(store.Verify(digest).ok());
  REQUIRE(store.Put("hello", digest).ok());
  CHECK(store.Verify(digest).ok());
}

TEST_CASE("Verify reports a corrupt store file", "[store]") {
  testing::TempDir dir;
  ModuleStore store(dir.path() + "/modules");
  REQUIRE(store.Init().ok());
  const std::string digest = Sha256Digest("hello");
  REQUIRE(store.Put("hello", digest).ok());
  std::string path = store.PathOf(digest);
  ::chmod(path.c_str(), 0600);
  std::ofstream(path, std::ios::trunc) << "tampered";
  absl::Status st = store.Verify(digest);
  REQUIRE(st.code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(st.message()),
             Catch::Contains(digest) && Catch::Contains("corrupt"));
  // Put repairs it.
  REQUIRE(store.Put("hello", digest).ok());
  CHECK(store.Verify(digest).ok());
}

TEST_CASE("Verify reports a missing store file", "[store]") {
  testing::TempDir dir;
  ModuleStore store(dir.path() + "/modules");
  REQUIRE(store.Init().ok());
  CHECK(store.Verify(Sha256Digest("absent")).code() ==
        absl::StatusCode::kNotFound);
}

TEST_CASE("Resolve rejects a file that is not a shared library", "[store]") {
  testing::TempDir dir;
  ModuleStore store(dir.path() + "/modules");
  REQUIRE(store.Init().ok());
  const std::string digest = Sha256Digest("not an ELF file");
  REQUIRE(store.Put("not an ELF file", digest).ok());
  auto sym = store.Resolve(digest, "Scale");
  REQUIRE(sym.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(sym.status().message()),
             Catch::Contains("cannot load module " + digest));
  CHECK(store.loaded_modules() == 0);
}

}  // namespace
}  // namespace kreg
