#include "daemon/supervisor/local_module_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "catch2/catch.hpp"
#include "daemon/store/module_store.h"
#include "tests/testing/temp_dir.h"

namespace kreg {
namespace {

ino_t Inode(int fd) {
  struct stat st;
  REQUIRE(::fstat(fd, &st) == 0);
  return st.st_ino;
}

// Puts `bytes` in `store`; returns their digest.
std::string Put(ModuleStore* store, const std::string& bytes) {
  const std::string digest = Sha256Digest(bytes);
  REQUIRE(store->Put(bytes, digest).ok());
  return digest;
}

// Overwrites the store file of `digest` with other bytes.
void Corrupt(ModuleStore* store, const std::string& digest) {
  const std::string path = store->PathOf(digest);
  ::chmod(path.c_str(), 0600);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "corrupt!";
}

TEST_CASE(
    "Every bind of a module shares one sealed memfd, copied and hashed once",
    "[local]") {
  testing::TempDir dir;
  ModuleStore store(dir.path() + "/modules");
  REQUIRE(store.Init().ok());
  const std::string bytes(10000, 'm');
  const std::string digest = Put(&store, bytes);
  LocalModuleCache cache(&store, 1 << 20, 1 << 20);
  absl::StatusOr<UniqueFd> first = cache.Open(digest, bytes.size(), 1);
  REQUIRE(first.ok());
  CHECK((::fcntl(first->get(), F_GET_SEALS) & kLocalModuleSeals) ==
        kLocalModuleSeals);
  CHECK((::fcntl(first->get(), F_GETFL) & O_ACCMODE) == O_RDONLY);
  CHECK(cache.bytes() == bytes.size());
  // Copied and hashed once: a store file that changes afterwards is not
  // read again (it was verified when the memfd was made).
  Corrupt(&store, digest);
  for (uint64_t session : {1, 1, 2, 3}) {
    absl::StatusOr<UniqueFd> again = cache.Open(digest, bytes.size(), session);
    REQUIRE(again.ok());
    CHECK(Inode(again->get()) == Inode(first->get()));
    // Its own open file description: reading one moves no other's offset.
    CHECK(::lseek(again->get(), 0, SEEK_CUR) == 0);
    char c = 0;
    REQUIRE(::read(again->get(), &c, 1) == 1);
    CHECK(c == 'm');
  }
  CHECK(::lseek(first->get(), 0, SEEK_CUR) == 0);
  CHECK(cache.bytes() == bytes.size());
}

TEST_CASE("The memfds held are bounded by max_local_module_memory_bytes",
          "[local]") {
  testing::TempDir dir;
  ModuleStore store(dir.path() + "/modules");
  REQUIRE(store.Init().ok());
  const std::string a = Put(&store, std::string(6000, 'a'));
  const std::string b = Put(&store, std::string(5000, 'b'));
  const std::string c = Put(&store, std::string(3000, 'c'));
  LocalModuleCache cache(&store, 10000, 1 << 20);
  REQUIRE(cache.Open(a, 6000, 1).ok());
  // Session 1 holds a: b does not fit beside it.
  absl::StatusOr<UniqueFd> refused = cache.Open(b, 5000, 2);
  REQUIRE(refused.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(refused.status().message()) ==
        "its module of 5000 bytes does not fit in the memory kregd keeps for "
        "modules handed out for local execution: live sessions hold 6000 of "
        "its 10000 bytes (max_local_module_memory_bytes); run the target "
        "isolated, bind it again once other sessions have ended, or ask the "
        "operator to raise max_local_module_memory_bytes");
  // c fits beside a.
  REQUIRE(cache.Open(c, 3000, 2).ok());
  CHECK(cache.bytes() == 9000);
  // Session 1 ended: a may go to make room for b; c, held, stays.
  cache.ReleaseSession(1);
  REQUIRE(cache.Open(b, 5000, 3).ok());
  CHECK(cache.bytes() == 8000);
  // A module larger than the whole budget never fits.
  absl::StatusOr<UniqueFd> huge = cache.Open(a, 20000, 4);
  CHECK(huge.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(cache.bytes() == 8000);
}

TEST_CASE("A dropped memfd is made and verified again on its next bind",
          "[local]") {
  testing::TempDir dir;
  ModuleStore store(dir.path() + "/modules");
  REQUIRE(store.Init().ok());
  const std::string a = Put(&store, std::string(6000, 'a'));
  const std::string b = Put(&store, std::string(6000, 'b'));
  LocalModuleCache cache(&store, 10000, 1 << 20);
  REQUIRE(cache.Open(a, 6000, 1).ok());
  cache.ReleaseSession(1);
  REQUIRE(cache.Open(b, 6000, 2).ok());  // drops a's memfd
  Corrupt(&store, a);
  cache.ReleaseSession(2);
  absl::StatusOr<UniqueFd> corrupt = cache.Open(a, 6000, 3);
  REQUIRE(corrupt.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(corrupt.status().message()),
             Catch::Contains(store.PathOf(a)) && Catch::Contains("is corrupt"));
  // The store's own errors pass through: a missing module.
  CHECK(cache.Open(Sha256Digest("absent"), 10, 3).status().code() ==
        absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kreg
