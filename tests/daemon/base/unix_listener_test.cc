// UnixListener: kregd's sockets are bound at a temporary name and renamed
// over the path, so that a restart never leaves the path missing (DESIGN
// §12), and a stopping kregd removes the path only while it is its own.
#include "daemon/base/unix_listener.h"

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "catch2/catch.hpp"

namespace kreg {
namespace {

// Socket paths must fit sun_path: a short directory under /tmp.
class ShortDir {
 public:
  ShortDir() {
    char tmpl[] = "/tmp/kul-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path_ = tmpl;
  }
  ~ShortDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A socket file at `path` that nothing listens on (a dead daemon's).
void StaleSocket(const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, path.c_str());
  REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) ==
          0);
}

bool Connects(const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, path.c_str());
  return ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr),
                   sizeof(addr)) == 0;
}

ino_t Inode(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

TEST_CASE("A listener takes its path with its mode and leaves no temp name",
          "[unix_listener]") {
  ShortDir dir;
  const std::string path = dir.path() + "/s";
  {
    auto l = UnixListener::Bind(path, 0660, static_cast<gid_t>(-1), "socket");
    REQUIRE(l.ok());
    struct stat st;
    REQUIRE(::lstat(path.c_str(), &st) == 0);
    CHECK(S_ISSOCK(st.st_mode));
    CHECK((st.st_mode & 0777) == 0660);
    CHECK(Connects(path));
    int entries = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
      (void)e;
      ++entries;
    }
    CHECK(entries == 1);
  }
  CHECK(Inode(path) == 0);  // removed when the listener goes
}

TEST_CASE("A stale socket is replaced without the path ever going missing",
          "[unix_listener]") {
  ShortDir dir;
  const std::string path = dir.path() + "/s";
  StaleSocket(path);
  const ino_t stale = Inode(path);
  REQUIRE(stale != 0);
  std::atomic<bool> stop{false};
  std::atomic<int> missing{0}, looks{0};
  std::thread watcher([&] {
    while (!stop.load()) {
      struct stat st;
      if (::lstat(path.c_str(), &st) != 0) missing.fetch_add(1);
      looks.fetch_add(1);
    }
  });
  while (looks.load() < 1000) std::this_thread::yield();
  auto l = UnixListener::Bind(path, 0660, static_cast<gid_t>(-1), "socket");
  const int before = looks.load();
  while (looks.load() < before + 1000) std::this_thread::yield();
  stop.store(true);
  watcher.join();
  REQUIRE(l.ok());
  CHECK(missing.load() == 0);
  CHECK(Inode(path) != stale);
  CHECK(Connects(path));
}

TEST_CASE("A stopping listener leaves a path a newer one took over",
          "[unix_listener]") {
  ShortDir dir;
  const std::string path = dir.path() + "/s";
  auto old = UnixListener::Bind(path, 0660, static_cast<gid_t>(-1), "socket");
  REQUIRE(old.ok());
  // A newer kregd's socket renamed over the path (as Bind does).
  const std::string other = dir.path() + "/n";
  StaleSocket(other);
  REQUIRE(::rename(other.c_str(), path.c_str()) == 0);
  const ino_t newer = Inode(path);
  { UnixListener gone = *std::move(old); }
  CHECK(Inode(path) == newer);
}

TEST_CASE("Bad socket paths are refused with the reason", "[unix_listener]") {
  ShortDir dir;
  SECTION("a live daemon") {
    const std::string path = dir.path() + "/s";
    auto first =
        UnixListener::Bind(path, 0660, static_cast<gid_t>(-1), "socket");
    REQUIRE(first.ok());
    auto second =
        UnixListener::Bind(path, 0660, static_cast<gid_t>(-1), "socket");
    REQUIRE(!second.ok());
    CHECK(second.status().code() == absl::StatusCode::kAlreadyExists);
    CHECK(second.status().message() ==
          "another daemon is already serving " + path +
              "; stop it first or pass a different --socket");
    CHECK(Connects(path));  // the first one's, untouched
  }
  SECTION("not a socket") {
    const std::string path = dir.path() + "/f";
    std::ofstream(path) << "x";
    auto l = UnixListener::Bind(path, 0660, static_cast<gid_t>(-1),
                                "session socket");
    REQUIRE(!l.ok());
    CHECK(l.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(l.status().message() ==
          "session socket path " + path +
              " exists and is not a socket; remove it or pass a different "
              "--socket");
  }
  SECTION("too long") {
    const std::string path = "/tmp/" + std::string(200, 'x');
    auto l = UnixListener::Bind(path, 0660, static_cast<gid_t>(-1), "socket");
    REQUIRE(!l.ok());
    CHECK(l.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(l.status().message()),
               Catch::Contains("is empty or longer than 107 bytes; choose a "
                               "shorter --socket"));
  }
  SECTION("a directory that does not exist") {
    const std::string path = dir.path() + "/no/such/s";
    auto l = UnixListener::Bind(path, 0660, static_cast<gid_t>(-1), "socket");
    REQUIRE(!l.ok());
    CHECK_THAT(std::string(l.status().message()),
               Catch::Contains("cannot bind " + path + ".new.") &&
                   Catch::Contains("No such file or directory"));
  }
}

}  // namespace
}  // namespace kreg
