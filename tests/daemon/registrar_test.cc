#include "daemon/registrar.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "catch2/catch.hpp"
#include "tests/testing/temp_dir.h"

namespace kreg {
namespace {

std::string Message(const absl::Status& s) { return std::string(s.message()); }

struct Tree {
  Tree() {
    root = std::filesystem::canonical(dir.path()).string() + "/root";
    outside = std::filesystem::canonical(dir.path()).string() + "/outside";
    std::filesystem::create_directories(root);
    std::filesystem::create_directories(outside);
    std::ofstream(root + "/mod.so") << "\x7f"
                                       "ELF module";
    std::ofstream(outside + "/evil.so") << "\x7f"
                                           "ELF evil";
    std::filesystem::create_symlink(outside + "/evil.so", root + "/link.so");
    std::filesystem::create_symlink(outside, root + "/dirlink");
    policy.allowed_roots = {root};
  }
  testing::TempDir dir;
  std::string root, outside;
  ModulePolicy policy;
};

TEST_CASE("OpenBeneath opens files under the root", "[registrar]") {
  Tree t;
  UniqueFd fd = OpenBeneath(t.root, t.root + "/mod.so");
  CHECK(fd.ok());
}

TEST_CASE("OpenBeneath refuses a symlink or .. out of the root",
          "[registrar]") {
  Tree t;
  // A symlink as the last component: O_NOFOLLOW's ELOOP.
  errno = 0;
  CHECK_FALSE(OpenBeneath(t.root, t.root + "/link.so").ok());
  CHECK(errno == ELOOP);
  // A link or ".." on the way out of the root: openat2's RESOLVE_BENEATH
  // (Linux >= 5.6, as on every machine this project runs on) says EXDEV.
  for (const std::string& escape :
       {t.root + "/dirlink/evil.so", t.root + "/../outside/evil.so"}) {
    INFO(escape);
    errno = 0;
    UniqueFd fd = OpenBeneath(t.root, escape);
    CHECK_FALSE(fd.ok());
    CHECK(errno == EXDEV);
  }
}

TEST_CASE("ReadModuleForPeer reads a module under a root", "[registrar]") {
  Tree t;
  auto bytes =
      ReadModuleForPeer(t.root + "/mod.so", t.policy, PeerCred{0, 0, 1});
  REQUIRE(bytes.ok());
  CHECK(*bytes ==
        "\x7f"
        "ELF module");
}

TEST_CASE("ReadModuleForPeer refuses a peer that may not read the file",
          "[registrar]") {
  Tree t;
  ::chmod((t.root + "/mod.so").c_str(), 0600);
  PeerCred stranger{54321, 54321, 7};
  auto r = ReadModuleForPeer(t.root + "/mod.so", t.policy, stranger);
  REQUIRE(r.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(Message(r.status()), Catch::Contains("not readable by uid 54321"));
  ::chmod((t.root + "/mod.so").c_str(), 0604);
  CHECK(ReadModuleForPeer(t.root + "/mod.so", t.policy, stranger).ok());
}

TEST_CASE("ReadModuleForPeer refuses paths outside the roots", "[registrar]") {
  Tree t;
  for (const std::string& p : {t.outside + "/evil.so", t.root + "/link.so",
                               t.root + "/../outside/evil.so"}) {
    INFO(p);
    auto r = ReadModuleForPeer(p, t.policy, PeerCred{0, 0, 1});
    CHECK(r.status().code() == absl::StatusCode::kPermissionDenied);
    CHECK_THAT(Message(r.status()),
               Catch::Contains("outside the daemon's allowed roots"));
  }
}

TEST_CASE("ReadModuleForPeer: relative, missing, directory, too large",
          "[registrar]") {
  Tree t;
  PeerCred root_peer{0, 0, 1};
  auto relative = ReadModuleForPeer("mod.so", t.policy, root_peer);
  CHECK(relative.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(Message(relative.status()), Catch::Contains("not absolute"));
  auto missing = ReadModuleForPeer(t.root + "/nope.so", t.policy, root_peer);
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  auto directory = ReadModuleForPeer(t.root, t.policy, root_peer);
  CHECK(directory.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(Message(directory.status()), Catch::Contains("not a regular"));
  ModulePolicy small = t.policy;
  small.max_module_bytes = 4;
  auto big = ReadModuleForPeer(t.root + "/mod.so", small, root_peer);
  CHECK(big.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(Message(big.status()), Catch::Contains("the limit is 4"));
}

}  // namespace
}  // namespace kreg
