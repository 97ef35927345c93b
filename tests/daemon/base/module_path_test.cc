#include "daemon/base/module_path.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "catch2/catch.hpp"
#include "tests/testing/temp_dir.h"

namespace kreg {
namespace {

struct Tree {
  Tree() {
    root = std::filesystem::canonical(dir.path()).string() + "/root";
    std::filesystem::create_directories(root + "/sub");
    std::ofstream(root + "/mod.so") << "\x7f"
                                       "ELF module";
    REQUIRE(::mkfifo((root + "/fifo").c_str(), 0644) == 0);
    std::filesystem::create_symlink(dir.path(), root + "/up");
    roots = {root};
  }
  testing::TempDir dir;
  std::string root;
  std::vector<std::string> roots;
};

TEST_CASE("OpenModulePath opens a regular file for reading", "[module_path]") {
  Tree t;
  PathOpen r = OpenModulePath(t.root + "/sub/../mod.so", t.roots);
  REQUIRE(r.stage == PathOpen::kOpened);
  CHECK(r.real == t.root + "/mod.so");
  CHECK(r.root == t.root);
  char buf[4];
  CHECK(::read(r.fd.get(), buf, 4) == 4);
  CHECK(std::string(buf, 4) ==
        "\x7f"
        "ELF");
}

TEST_CASE("OpenModulePath refuses a FIFO at once, without opening it",
          "[module_path]") {
  Tree t;
  auto start = std::chrono::steady_clock::now();
  PathOpen r = OpenModulePath(t.root + "/fifo", t.roots);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(2));
  CHECK(r.stage == PathOpen::kNotRegular);
  CHECK(S_ISFIFO(r.mode));
  CHECK_FALSE(r.fd.ok());
  CHECK(std::string(FileTypeName(r.mode)) == "a FIFO (named pipe)");
}

TEST_CASE("OpenModulePath refuses directories, sockets and devices",
          "[module_path]") {
  Tree t;
  PathOpen dir = OpenModulePath(t.root + "/sub", t.roots);
  CHECK(dir.stage == PathOpen::kNotRegular);
  CHECK(std::string(FileTypeName(dir.mode)) == "a directory");
  std::string sock_path = t.root + "/s";
  int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, sock_path.c_str(), sizeof(addr.sun_path) - 1);
  REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  PathOpen sock = OpenModulePath(sock_path, t.roots);
  ::close(s);
  CHECK(sock.stage == PathOpen::kNotRegular);
  CHECK(std::string(FileTypeName(sock.mode)) == "a socket");
  PathOpen dev = OpenModulePath("/dev/null", {"/dev"});
  CHECK(dev.stage == PathOpen::kNotRegular);
  CHECK(std::string(FileTypeName(dev.mode)) == "a character device");
}

TEST_CASE("OpenModulePath: missing, outside the roots, escapes",
          "[module_path]") {
  Tree t;
  PathOpen missing = OpenModulePath(t.root + "/nope.so", t.roots);
  CHECK(missing.stage == PathOpen::kUnresolved);
  CHECK(missing.err == ENOENT);
  PathOpen outside = OpenModulePath(t.root + "/up", t.roots);
  CHECK(outside.stage == PathOpen::kOutsideRoots);
  CHECK(outside.real == std::filesystem::canonical(t.dir.path()).string());
}

TEST_CASE("The helper's reply round-trips; garbage is refused",
          "[module_path]") {
  PathOpen r;
  r.stage = PathOpen::kNotRegular;
  r.mode = S_IFIFO | 0644;
  r.root = "/srv/k";
  r.real = "/srv/k/odd name\twith tab";
  absl::StatusOr<PathOpen> back = DecodePathOpen(EncodePathOpen(r));
  REQUIRE(back.ok());
  CHECK(back->stage == r.stage);
  CHECK(back->mode == r.mode);
  CHECK(back->root == r.root);
  CHECK(back->real == r.real);
  for (const std::string& bad :
       {std::string("x"), std::string("9 0 0\0a\0b", 9),
        std::string("1 0 0\0a", 7)}) {
    auto d = DecodePathOpen(bad);
    CHECK(d.status().code() == absl::StatusCode::kInternal);
    CHECK_THAT(std::string(d.status().message()),
               Catch::Contains("reply is unreadable"));
  }
}

TEST_CASE("OpenModulePathAs reports a helper that cannot be started",
          "[module_path]") {
  auto r = OpenModulePathAs("/nonexistent/kregd-probe", "/x.so", {"/"}, 1, 1);
  CHECK(r.status().code() == absl::StatusCode::kInternal);
  CHECK_THAT(std::string(r.status().message()),
             Catch::Contains("cannot start the open helper "
                             "/nonexistent/kregd-probe"));
}

}  // namespace
}  // namespace kreg
