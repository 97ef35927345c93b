#include "daemon/registry/registrar.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
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

TEST_CASE("ReadModuleForPeer refuses a symlink or .. out of the root",
          "[registrar]") {
  Tree t;
  for (const std::string& escape :
       {t.root + "/link.so", t.root + "/dirlink/evil.so",
        t.root + "/../outside/evil.so"}) {
    INFO(escape);
    auto r = ReadModuleForPeer(escape, t.policy, PeerCred{0, 0, 1});
    CHECK(r.status().code() == absl::StatusCode::kPermissionDenied);
    CHECK_THAT(Message(r.status()),
               Catch::Contains("outside the daemon's allowed roots"));
  }
}

TEST_CASE("ReadModuleForPeer refuses a FIFO at once, naming its type",
          "[registrar]") {
  Tree t;
  std::string fifo = t.root + "/libfifo.so";
  REQUIRE(::mkfifo(fifo.c_str(), 0666) == 0);
  auto start = std::chrono::steady_clock::now();
  auto r = ReadModuleForPeer(fifo, t.policy, PeerCred{0, 0, 1});
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(2));
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(Message(r.status()),
             Catch::Contains("\"" + fifo +
                             "\" is a FIFO (named pipe), not a "
                             "regular file"));
}

TEST_CASE("ReadModuleForPeer refuses a path with a NUL instead of cutting it",
          "[registrar]") {
  Tree t;
  std::string path = t.root + "/mod.so" + std::string(1, '\0') + "junk";
  auto r = ReadModuleForPeer(path, t.policy, PeerCred{0, 0, 1});
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(Message(r.status()), Catch::Contains("contains a NUL byte at "
                                                  "position"));
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

TEST_CASE("Without the helper, mode bits are checked along the whole path",
          "[registrar]") {
  Tree t;
  // The peer is neither root nor this process's uid, and there is no open
  // helper: the check by mode bits of every directory and the file.
  for (std::string d = t.root; d.rfind("/tmp/", 0) == 0;
       d = d.substr(0, d.rfind('/'))) {
    ::chmod(d.c_str(), 0755);
  }
  PeerCred stranger{54321, 54321, 7};
  ::chmod((t.root + "/mod.so").c_str(), 0600);
  auto r = ReadModuleForPeer(t.root + "/mod.so", t.policy, stranger);
  REQUIRE(r.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(Message(r.status()),
             Catch::Contains("permission denied reading module") &&
                 Catch::Contains("as uid 54321: the file is not readable"));
  ::chmod((t.root + "/mod.so").c_str(), 0604);
  CHECK(ReadModuleForPeer(t.root + "/mod.so", t.policy, stranger).ok());
  std::filesystem::create_directories(t.root + "/private");
  std::ofstream(t.root + "/private/mod.so") << "\x7f"
                                               "ELF private";
  ::chmod((t.root + "/private/mod.so").c_str(), 0644);
  ::chmod((t.root + "/private").c_str(), 0700);
  auto hidden =
      ReadModuleForPeer(t.root + "/private/mod.so", t.policy, stranger);
  REQUIRE(hidden.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(Message(hidden.status()),
             Catch::Contains("as uid 54321: directory " + t.root +
                             "/private is not searchable"));
  // Root and the daemon's own uid read as the daemon.
  CHECK(ReadModuleForPeer(t.root + "/private/mod.so", t.policy,
                          PeerCred{::geteuid(), ::getegid(), 1})
            .ok());
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
  CHECK_THAT(Message(directory.status()),
             Catch::Contains("is a directory, not a regular file"));
  ModulePolicy small = t.policy;
  small.max_module_bytes = 4;
  auto big = ReadModuleForPeer(t.root + "/mod.so", small, root_peer);
  CHECK(big.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(Message(big.status()), Catch::Contains("the limit is 4"));
}

}  // namespace
}  // namespace kreg
