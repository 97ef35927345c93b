#include "daemon/compile_service/compile_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "catch2/catch.hpp"
#include "tests/testing/temp_dir.h"

namespace kreg {
namespace {

std::string Key(char c) { return "kcc-sha256:" + std::string(64, c); }

TEST_CASE("Put then Get returns the bytes; a missing key is nullopt",
          "[compile]") {
  testing::TempDir dir;
  CompileCache cache(dir.path() + "/compile", 0);
  REQUIRE(cache.Init().ok());
  CHECK_FALSE(cache.Get(Key('a')).has_value());
  REQUIRE(cache.Put(Key('a'), "module").ok());
  CHECK(cache.Get(Key('a')) == std::optional<std::string>("module"));
  CHECK(std::filesystem::exists(dir.path() + "/compile/" +
                                std::string(64, 'a') + ".so"));
  CompileCacheUsage u = cache.Usage();
  CHECK(u.files == 1);
  CHECK(u.bytes == 6);
}

TEST_CASE("The size bound evicts the least recently used entry", "[compile]") {
  testing::TempDir dir;
  CompileCache cache(dir.path() + "/compile", 25);
  REQUIRE(cache.Init().ok());
  REQUIRE(cache.Put(Key('a'), std::string(10, 'a')).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE(cache.Put(Key('b'), std::string(10, 'b')).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  // A hit makes 'a' the most recently used.
  REQUIRE(cache.Get(Key('a')).has_value());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE(cache.Put(Key('c'), std::string(10, 'c')).ok());
  CHECK(cache.Get(Key('a')).has_value());
  CHECK_FALSE(cache.Get(Key('b')).has_value());
  CHECK(cache.Get(Key('c')).has_value());
  CHECK(cache.Usage().bytes == 20);
}

TEST_CASE("TrimTo removes oldest first and reports what it kept", "[compile]") {
  testing::TempDir dir;
  CompileCache cache(dir.path() + "/compile", 0);
  REQUIRE(cache.Init().ok());
  for (char c : {'a', 'b', 'c'}) {
    REQUIRE(cache.Put(Key(c), std::string(10, c)).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CompileCacheTrim t = cache.TrimTo(15);
  CHECK(t.removed.files == 2);
  CHECK(t.removed.bytes == 20);
  CHECK(t.kept.files == 1);
  CHECK(cache.Get(Key('c')).has_value());
  CHECK(cache.TrimTo(0).removed.files == 1);
  CHECK(cache.Usage().files == 0);
}

TEST_CASE("Files that are not cache entries are left alone", "[compile]") {
  testing::TempDir dir;
  CompileCache cache(dir.path() + "/compile", 0);
  REQUIRE(cache.Init().ok());
  std::filesystem::create_directory(dir.path() + "/compile/sub.so");
  ::symlink("/etc/passwd", (dir.path() + "/compile/link.so").c_str());
  CHECK(cache.Usage().files == 0);
  CHECK(cache.TrimTo(0).removed.files == 0);
  CHECK(std::filesystem::exists(dir.path() + "/compile/sub.so"));
  CHECK_FALSE(cache.Get("kcc-sha256:link").has_value());
}

TEST_CASE("Init fails with the path when the directory cannot be made",
          "[compile]") {
  CompileCache cache("/proc/kreg-no/compile", 0);
  absl::Status s = cache.Init();
  CHECK(s.code() == absl::StatusCode::kInternal);
  CHECK(std::string(s.message()).find("/proc/kreg-no/compile") !=
        std::string::npos);
}

}  // namespace
}  // namespace kreg
