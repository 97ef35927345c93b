// A connected pair of Unix stream sockets (close-on-exec), closed at scope
// exit; a failed socketpair fails the test.
#ifndef KREGD_TESTS_TESTING_SOCKET_PAIR_H_
#define KREGD_TESTS_TESTING_SOCKET_PAIR_H_

#include <sys/socket.h>

#include "catch2/catch.hpp"
#include "common/unique_fd.h"

namespace kreg::testing {

struct SocketPair {
  SocketPair() {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    a.reset(sv[0]);
    b.reset(sv[1]);
  }
  UniqueFd a, b;
};

}  // namespace kreg::testing

#endif  // KREGD_TESTS_TESTING_SOCKET_PAIR_H_
