#include "daemon/platform_table.h"

#include <cstdlib>

#include "common/platforms.h"

namespace kreg {
namespace {

constexpr PlatformTraits kTraits[] = {
    {Platform::kCpu, PlatformMemory::kHost, PlatformCompiler::kCxx,
     /*ffi_stream=*/false, /*ffi_thread_pool=*/true},
    {Platform::kCuda, PlatformMemory::kCuda, PlatformCompiler::kNvcc,
     /*ffi_stream=*/true, /*ffi_thread_pool=*/false},
};
constexpr size_t kNumTraits = sizeof(kTraits) / sizeof(*kTraits);

constexpr bool RowsInOrder() {
  for (size_t i = 0; i < kNumTraits; ++i) {
    if (static_cast<size_t>(kTraits[i].platform) != i) return false;
  }
  return true;
}
static_assert(kNumTraits == kNumPlatforms,
              "one row per platform of common/platforms.h");
static_assert(RowsInOrder(), "row i is Platform i");

PlatformTraits g_added[8];
size_t g_num_added = 0;

}  // namespace

const PlatformTraits& TraitsOf(Platform platform) {
  const size_t i = static_cast<size_t>(platform);
  if (i < kNumTraits) return kTraits[i];
  if (i - kNumTraits < g_num_added) return g_added[i - kNumTraits];
  std::abort();  // not a Platform ParsePlatform returns
}

std::vector<Platform> AllPlatforms() {
  std::vector<Platform> out;
  for (size_t i = 0; i < kNumTraits + g_num_added; ++i) {
    out.push_back(static_cast<Platform>(i));
  }
  return out;
}

bool AddPlatformTraitsForTest(const PlatformTraits& traits) {
  const size_t next = kNumTraits + g_num_added;
  if (static_cast<size_t>(traits.platform) != next || next >= NumPlatforms() ||
      g_num_added == sizeof(g_added) / sizeof(*g_added)) {
    return false;
  }
  g_added[g_num_added++] = traits;
  return true;
}

}  // namespace kreg
