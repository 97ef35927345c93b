#include "common/sha256.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <string>

#include "catch2/catch.hpp"
#include "daemon/module_store.h"
#include "tests/testing/temp_dir.h"

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

std::string Hex(const std::string& bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
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
