#include "daemon/executor/shm_arena.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "catch2/catch.hpp"
#include "tests/daemon/executor/test_util.h"

namespace kreg {
namespace {

using ::kreg::testing::MakeMemfd;

TEST_CASE("Arena maps a sealed memfd shared with the client", "[arena]") {
  ShmArena arena(1 << 20);
  UniqueFd fd = MakeMemfd(8192);
  void* client =
      ::mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  REQUIRE(client != MAP_FAILED);
  REQUIRE(arena.Replace(std::move(fd), 8192).ok());
  CHECK(arena.size() == 8192);
  std::memcpy(static_cast<char*>(client) + 100, "hello", 5);
  auto region = arena.Region(100, 5);
  REQUIRE(region.ok());
  CHECK(std::memcmp(*region, "hello", 5) == 0);
  ::munmap(client, 8192);
}

TEST_CASE("Arena refuses size 0", "[arena]") {
  ShmArena arena(1 << 20);
  absl::Status s = arena.Replace(MakeMemfd(4096), 0);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message() == "arena size must be positive, got 0");
}

TEST_CASE("Arena refuses sizes above max_arena_bytes", "[arena]") {
  ShmArena arena(4096);
  absl::Status s = arena.Replace(MakeMemfd(8192), 8192);
  CHECK(s.code() == absl::StatusCode::kResourceExhausted);
  CHECK(s.message() ==
        "arena of 8192 bytes exceeds the daemon's limit of 4096 bytes "
        "(max_arena_bytes)");
}

TEST_CASE("Arena refuses an unsealed memfd", "[arena]") {
  ShmArena arena(1 << 20);
  absl::Status s = arena.Replace(MakeMemfd(4096, /*seal=*/false), 4096);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message() == "arena fd must be a memfd sealed with F_SEAL_SHRINK");
}

TEST_CASE("Arena refuses a descriptor that is not a memfd", "[arena]") {
  ShmArena arena(1 << 20);
  int p[2];
  REQUIRE(::pipe(p) == 0);
  ::close(p[1]);
  absl::Status s = arena.Replace(UniqueFd(p[0]), 4096);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message() == "arena fd must be a memfd sealed with F_SEAL_SHRINK");
}

TEST_CASE("Arena refuses a memfd smaller than announced", "[arena]") {
  ShmArena arena(1 << 20);
  absl::Status s = arena.Replace(MakeMemfd(4096), 8192);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message() ==
        "arena fd holds 4096 bytes, less than the 8192 bytes announced");
}

TEST_CASE("A failed Replace keeps the current arena", "[arena]") {
  ShmArena arena(1 << 20);
  REQUIRE(arena.Replace(MakeMemfd(4096), 4096).ok());
  CHECK_FALSE(arena.Replace(MakeMemfd(4096, false), 4096).ok());
  CHECK(arena.size() == 4096);
  CHECK(arena.Region(0, 4096).ok());
}

TEST_CASE("Arena regions: offset+size overflow", "[arena]") {
  ShmArena arena(1 << 20);
  REQUIRE(arena.Replace(MakeMemfd(4096), 4096).ok());
  auto r = arena.Region(~uint64_t{0}, 2);
  CHECK(r.status().code() == absl::StatusCode::kOutOfRange);
  CHECK(r.status().message() ==
        "region offset 18446744073709551615 + size 2 overflows");
}

TEST_CASE("Arena regions: end past the arena", "[arena]") {
  ShmArena arena(1 << 20);
  REQUIRE(arena.Replace(MakeMemfd(4096), 4096).ok());
  auto r = arena.Region(4000, 100);
  CHECK(r.status().code() == absl::StatusCode::kOutOfRange);
  CHECK(r.status().message() ==
        "region [4000, 4100) ends past the session arena of 4096 bytes");
  CHECK(arena.Region(4096, 0).ok());
  CHECK(arena.Region(0, 4096).ok());
}

TEST_CASE("Empty arena gives zero-size regions a non-null pointer", "[arena]") {
  ShmArena arena(1 << 20);
  auto r = arena.Region(0, 0);
  REQUIRE(r.ok());
  CHECK(*r != nullptr);
  CHECK(arena.Region(0, 1).status().code() == absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace kreg
