// Helpers shared by the libFuzzer targets in tests/fuzz (see README.md).
#ifndef KREGD_TESTS_FUZZ_FUZZ_UTIL_H_
#define KREGD_TESTS_FUZZ_FUZZ_UTIL_H_

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>

#include "common/unique_fd.h"
#include "spdlog/spdlog.h"

namespace kreg::fuzz {

// A finding: prints `what` and aborts, which libFuzzer reports as a crash
// (with the input that caused it).
[[noreturn]] inline void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz invariant violated: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// kregd logs a line per refused message; at fuzzing rates that is noise.
inline void QuietLogs() { spdlog::set_level(spdlog::level::off); }

// A fresh directory under $TMPDIR (or /tmp), never removed: a fuzzer process
// makes one at start-up.
inline std::string MakeTempDir(const char* tag) {
  const char* base = getenv("TMPDIR");
  std::string templ =
      std::string(base && *base ? base : "/tmp") + "/kreg-" + tag + "-XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) Fail("mkdtemp " + templ);
  return templ;
}

// A memfd of `size` bytes sealed against shrinking and growing, as a
// client's arena is.
inline UniqueFd SealedMemfd(uint64_t size) {
  UniqueFd fd(::memfd_create("fuzz-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.ok() || ::ftruncate(fd.get(), static_cast<off_t>(size)) != 0 ||
      ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    Fail("memfd");
  }
  return fd;
}

// The reading end of a stream socket whose peer wrote `data` (its first
// 64 KiB, which fit the socket buffer) and closed; invalid on failure.
inline UniqueFd ClosedStream(const uint8_t* data, size_t size) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return UniqueFd();
  }
  UniqueFd ours(sv[0]), theirs(sv[1]);
  const size_t n = std::min<size_t>(size, 64 * 1024);
  if (n > 0 && ::write(theirs.get(), data, n) != static_cast<ssize_t>(n)) {
    return UniqueFd();
  }
  return ours;
}

}  // namespace kreg::fuzz

#endif  // KREGD_TESTS_FUZZ_FUZZ_UTIL_H_
