// The platforms kregd serves and how they are spelled (DESIGN §2: a target
// is a name on a platform): defined here once for kregd and the shim. The
// Python client keeps a copy (client/python/kreg/_client.py) that
// tests/python/test_docs.py checks against this table. What kregd does per
// platform is in daemon/base/platform_table.h and
// daemon/executor/platform_executors.h (docs/adding-a-platform.md).
#ifndef KREGD_COMMON_PLATFORMS_H_
#define KREGD_COMMON_PLATFORMS_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace kreg {

struct PlatformRow {
  const char* name;      // canonical, lower case; the row's index is its id
  const char* jax_name;  // what jax.ffi.register_ffi_target calls it
  const char* alias;     // another spelling accepted (lower case), or null
};

inline constexpr PlatformRow kPlatforms[] = {
    {"cpu", "cpu", "host"},
    {"cuda", "CUDA", "gpu"},
};
inline constexpr size_t kNumPlatforms =
    sizeof(kPlatforms) / sizeof(*kPlatforms);

// A per-platform table (this file's, daemon/base/platform_table.cc's,
// daemon/executor/platform_executors.cc's): its fixed rows, one per
// platform of kPlatforms, then at most kMaxAdded rows a test appended
// (docs/adding-a-platform.md). Constant-initialized. Add is not
// thread-safe: tests add before any other thread reads.
template <typename Row, size_t kMaxAdded>
class PlatformRows {
 public:
  template <size_t N>
  constexpr explicit PlatformRows(const Row (&fixed)[N])
      : fixed_(fixed), num_fixed_(N), added_{} {}
  size_t size() const { return num_fixed_ + num_added_; }
  const Row& operator[](size_t i) const {  // i < size()
    return i < num_fixed_ ? fixed_[i] : added_[i - num_fixed_];
  }
  // Appends `row`; false when kMaxAdded rows were added already.
  bool Add(const Row& row) {
    if (num_added_ == kMaxAdded) return false;
    added_[num_added_++] = row;
    return true;
  }

 private:
  const Row* fixed_;
  size_t num_fixed_;
  Row added_[kMaxAdded];
  size_t num_added_ = 0;
};

// Whether rows[i].platform is platform i for every row, and there is one
// row per platform of kPlatforms (the daemon tables' static checks).
template <typename Row, size_t N>
constexpr bool OneRowPerPlatformInOrder(const Row (&rows)[N]) {
  if (N != kNumPlatforms) return false;
  for (size_t i = 0; i < N; ++i) {
    if (static_cast<size_t>(rows[i].platform) != i) return false;
  }
  return true;
}

// The rows in use: kPlatforms, then those a test added (AddPlatformForTest).
size_t NumPlatforms();
const PlatformRow& PlatformAt(size_t index);  // index < NumPlatforms()

// Tests only (a fake platform, docs/adding-a-platform.md): appends `row` and
// returns its index, or -1 when the table is full (8 rows) or a spelling of
// `row` is taken. Not thread-safe: call before any other thread reads the
// table.
int AddPlatformForTest(const PlatformRow& row);

// Platforms of JAX that kregd does not serve (refused as unsupported
// rather than unknown).
inline constexpr const char* kUnservedPlatforms[] = {"rocm", "tpu", "metal",
                                                     "sycl"};

// The row index of `spelling` (its name or alias, any case); -1 if none.
int FindPlatform(std::string_view spelling);
// Whether `spelling` (any case) is one of kUnservedPlatforms.
bool IsUnservedPlatform(std::string_view spelling);
// `"cpu" (alias "host") or "cuda" (alias "gpu")`, for messages.
std::string PlatformChoices();

}  // namespace kreg

#endif  // KREGD_COMMON_PLATFORMS_H_
