// Checks that a decoded launch only points into its arena (shared by the
// session and launch-decoder fuzz targets).
#ifndef KREGD_TESTS_FUZZ_BUFFER_CHECK_H_
#define KREGD_TESTS_FUZZ_BUFFER_CHECK_H_

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "daemon/base/launch.h"
#include "tests/fuzz/fuzz_util.h"

namespace kreg::fuzz {

// The byte count of `b` (dims times the dtype's width); a finding when the
// decoder let it overflow or accepted a dtype without a byte width.
inline uint64_t BufferBytes(const BufferRef& b) {
  int width = DtypeByteWidth(b.dtype);
  if (width <= 0)
    Fail(absl::StrCat("decoded dtype ", b.dtype, " has no width"));
  uint64_t n = static_cast<uint64_t>(width);
  for (int64_t d : b.dims) {
    if (d < 0) Fail(absl::StrCat("decoded negative dim ", d));
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) {
      Fail("decoded dims overflow");
    }
  }
  return n;
}

// Every CPU buffer of `frame` lies inside [base, base + size); the rets are
// written and the args read, so a stray pointer faults under the fuzzer.
inline void CheckCpuFrame(const LaunchFrame& frame, char* base, uint64_t size) {
  uint64_t sum = 0;
  for (const auto* list : {&frame.args, &frame.rets}) {
    for (const BufferRef& b : *list) {
      uint64_t n = BufferBytes(b);
      if (n == 0) continue;
      char* p = static_cast<char*>(b.data);
      if (p < base || static_cast<uint64_t>(p - base) > size ||
          size - static_cast<uint64_t>(p - base) < n) {
        Fail(absl::StrCat("buffer of ", n, " bytes at arena offset ", p - base,
                          " escapes an arena of ", size, " bytes"));
      }
      if (list == &frame.rets) {
        std::memset(p, 0x5a, n);
      } else {
        for (uint64_t i = 0; i < n; ++i) sum += static_cast<uint8_t>(p[i]);
      }
    }
  }
  asm volatile("" : : "r"(sum));
}

}  // namespace kreg::fuzz

#endif  // KREGD_TESTS_FUZZ_BUFFER_CHECK_H_
