// Helpers for the session tests: sealed memfds and arenas.
#ifndef KREGD_TESTS_DAEMON_EXECUTOR_TEST_UTIL_H_
#define KREGD_TESTS_DAEMON_EXECUTOR_TEST_UTIL_H_

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

#include "common/unique_fd.h"

namespace kreg::testing {

// A memfd of `size` bytes, sealed against shrinking when `seal`.
inline UniqueFd MakeMemfd(uint64_t size, bool seal = true) {
  UniqueFd fd(::memfd_create("test-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) return UniqueFd();
  if (seal &&
      ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    return UniqueFd();
  }
  return fd;
}

}  // namespace kreg::testing

#endif  // KREGD_TESTS_DAEMON_EXECUTOR_TEST_UTIL_H_
