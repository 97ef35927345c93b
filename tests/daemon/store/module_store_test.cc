#include "daemon/store/module_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "catch2/catch.hpp"
#include "common/sha256.h"
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

// The shim's SHA-256 (common/sha256, libc only) against kregd's (OpenSSL),
// and the sealed module copies handed out for local execution.

TEST_CASE("Sha256Hex equals kregd's digest for every length and split",
          "[sha256]") {
  std::mt19937 rng(7);
  for (size_t n :
       {1u, 55u, 56u, 63u, 64u, 65u, 119u, 120u, 128u, 1000u, 4096u, 100003u}) {
    std::string bytes(n, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    INFO("length " << n);
    CHECK(Sha256Hex(bytes.data(), bytes.size()) == Sha256Digest(bytes));
    // Fed in uneven pieces.
    Sha256 h;
    size_t done = 0;
    for (size_t piece = 1; done < n; piece = piece * 3 + 1) {
      size_t take = std::min(piece, n - done);
      h.Update(bytes.data() + done, take);
      done += take;
    }
    uint8_t d[32];
    h.Final(d);
    std::string whole = Sha256Digest(bytes);
    std::string hex;
    for (uint8_t b : d) {
      static constexpr char kHex[] = "0123456789abcdef";
      hex.push_back(kHex[b >> 4]);
      hex.push_back(kHex[b & 15]);
    }
    CHECK("sha256:" + hex == whole);
  }
}

TEST_CASE("SealedCopy hands out the stored bytes, sealed", "[store][local]") {
  testing::TempDir dir;
  ModuleStore store(dir.path() + "/modules");
  REQUIRE(store.Init().ok());
  const std::string bytes(10000, 'k');
  const std::string digest = Sha256Digest(bytes);
  REQUIRE(store.Put(bytes, digest).ok());
  absl::StatusOr<UniqueFd> fd = store.SealedCopy(digest, 1 << 20);
  REQUIRE(fd.ok());
  struct stat st;
  REQUIRE(::fstat(fd->get(), &st) == 0);
  CHECK(st.st_size == 10000);
  CHECK((::fcntl(fd->get(), F_GET_SEALS) & kLocalModuleSeals) ==
        kLocalModuleSeals);
  std::string back(bytes.size(), '\0');
  REQUIRE(::pread(fd->get(), back.data(), back.size(), 0) ==
          static_cast<ssize_t>(back.size()));
  CHECK(back == bytes);
  // Nobody can change it: writes, growth, shrinking and writable mappings
  // are refused.
  CHECK(::pwrite(fd->get(), "x", 1, 0) < 0);
  CHECK(::ftruncate(fd->get(), 1) != 0);
  CHECK(::ftruncate(fd->get(), 20000) != 0);
  CHECK(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd->get(),
               0) == MAP_FAILED);
  CHECK(::fcntl(fd->get(), F_ADD_SEALS, 0) != 0);  // F_SEAL_SEAL
}

TEST_CASE("SealedCopy refuses a corrupt store file, naming it",
          "[store][local]") {
  testing::TempDir dir;
  ModuleStore store(dir.path() + "/modules");
  REQUIRE(store.Init().ok());
  const std::string digest = Sha256Digest("hello");
  REQUIRE(store.Put("hello", digest).ok());
  const std::string path = store.PathOf(digest);
  ::chmod(path.c_str(), 0600);
  { std::ofstream(path, std::ios::binary | std::ios::trunc) << "jello"; }
  absl::StatusOr<UniqueFd> fd = store.SealedCopy(digest, 1 << 20);
  REQUIRE(fd.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(fd.status().message()),
             Catch::Contains(path) && Catch::Contains("is corrupt") &&
                 Catch::Contains(Sha256Digest("jello")));
}

TEST_CASE("SealedCopy refuses a module over the size limit and a missing one",
          "[store][local]") {
  testing::TempDir dir;
  ModuleStore store(dir.path() + "/modules");
  REQUIRE(store.Init().ok());
  const std::string bytes(5000, 'a');
  const std::string digest = Sha256Digest(bytes);
  REQUIRE(store.Put(bytes, digest).ok());
  absl::StatusOr<UniqueFd> fd = store.SealedCopy(digest, 4096);
  REQUIRE(fd.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(
      std::string(fd.status().message()),
      Catch::Contains("5000 bytes") && Catch::Contains("max_module_bytes"));
  absl::StatusOr<UniqueFd> missing =
      store.SealedCopy(Sha256Digest("absent"), 1 << 20);
  CHECK(missing.status().code() == absl::StatusCode::kUnavailable);
}

TEST_CASE("SealedCopy's test hook corrupts the copy, not the store",
          "[store][local]") {
  testing::TempDir dir;
  ModuleStore store(dir.path() + "/modules");
  REQUIRE(store.Init().ok());
  const std::string digest = Sha256Digest("module");
  REQUIRE(store.Put("module", digest).ok());
  absl::StatusOr<UniqueFd> fd = store.SealedCopy(digest, 1 << 20, true);
  REQUIRE(fd.ok());
  char back[6];
  REQUIRE(::pread(fd->get(), back, 6, 0) == 6);
  CHECK(std::string(back, 6) != "module");
  CHECK(store.Verify(digest).ok());
}

}  // namespace
}  // namespace kreg
