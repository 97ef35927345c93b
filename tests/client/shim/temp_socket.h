// A listening Unix socket in a temp directory, for the shim tests' fake
// kregds (fake_kregd.h, cuda_launch_test).
#ifndef KREGD_TESTS_CLIENT_SHIM_TEMP_SOCKET_H_
#define KREGD_TESTS_CLIENT_SHIM_TEMP_SOCKET_H_

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "catch2/catch.hpp"

namespace kreg::shim {

// A listening Unix socket `path` in a fresh temp directory (`prefix`: a
// mkdtemp template), removed with it.
class TempSessionSocket {
 public:
  explicit TempSessionSocket(std::string prefix) {
    REQUIRE(::mkdtemp(prefix.data()) != nullptr);
    dir_ = prefix;
    path = dir_ + "/kregd.sock.session";
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, path.c_str());
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(::listen(fd, 4) == 0);
  }
  ~TempSessionSocket() {
    ::close(fd);
    ::unlink(path.c_str());
    ::rmdir(dir_.c_str());
  }
  TempSessionSocket(const TempSessionSocket&) = delete;
  TempSessionSocket& operator=(const TempSessionSocket&) = delete;

  std::string path;
  int fd = -1;

 private:
  std::string dir_;
};

}  // namespace kreg::shim

#endif  // KREGD_TESTS_CLIENT_SHIM_TEMP_SOCKET_H_
