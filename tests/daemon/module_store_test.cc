#include "daemon/module_store.h"

#include <sys/stat.h>

#include <filesystem>
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

int CountFiles(const std::string& dir) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    (void)e;
    ++n;
  }
  return n;
}

TEST_CASE("WriteTemp is not in the store until CommitTemp", "[store]") {
  testing::TempDir dir;
  ModuleStore store(dir.path() + "/modules");
  REQUIRE(store.Init().ok());
  const std::string digest = Sha256Digest("module");
  auto temp = store.WriteTemp("module", digest);
  REQUIRE(temp.ok());
  CHECK(std::filesystem::exists(*temp));
  CHECK(store.Verify(digest).code() == absl::StatusCode::kNotFound);
  REQUIRE(store.CommitTemp(*temp, digest).ok());
  CHECK_FALSE(std::filesystem::exists(*temp));
  CHECK(store.Verify(digest).ok());
}

TEST_CASE("Init removes temp files an interrupted registration left",
          "[store]") {
  testing::TempDir dir;
  const std::string modules = dir.path() + "/modules";
  {
    ModuleStore store(modules);
    REQUIRE(store.Init().ok());
    REQUIRE(store.WriteTemp("orphan", Sha256Digest("orphan")).ok());
    REQUIRE(store.Put("kept", Sha256Digest("kept")).ok());
    CHECK(CountFiles(modules) == 2);
  }
  ModuleStore store(modules);
  REQUIRE(store.Init().ok());
  CHECK(CountFiles(modules) == 1);
  CHECK(store.Verify(Sha256Digest("kept")).ok());
}

TEST_CASE("RemoveUnreferenced removes what is not kept, counts bytes",
          "[store][gc]") {
  testing::TempDir dir;
  const std::string modules = dir.path() + "/modules";
  ModuleStore store(modules);
  REQUIRE(store.Init().ok());
  REQUIRE(store.Put("keep me", Sha256Digest("keep me")).ok());
  REQUIRE(store.Put("drop", Sha256Digest("drop")).ok());
  REQUIRE(store.WriteTemp("temp!", Sha256Digest("temp!")).ok());
  std::ofstream(modules + "/README") << "not a store file";
  uint64_t files, bytes, kept_files, kept_bytes;
  REQUIRE(store
              .RemoveUnreferenced({Sha256Digest("keep me")}, &files, &bytes,
                                  &kept_files, &kept_bytes)
              .ok());
  CHECK(files == 2);
  CHECK(bytes == 4 + 5);
  CHECK(kept_files == 1);
  CHECK(kept_bytes == 7);
  CHECK(store.Verify(Sha256Digest("keep me")).ok());
  CHECK(store.Verify(Sha256Digest("drop")).code() ==
        absl::StatusCode::kNotFound);
  CHECK(std::filesystem::exists(modules + "/README"));
  CHECK(CountFiles(modules) == 2);
}

}  // namespace
}  // namespace kreg
