#include "daemon/base/platform_table.h"

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
static_assert(OneRowPerPlatformInOrder(kTraits),
              "one row per platform of common/platforms.h, row i is Platform "
              "i");

PlatformRows<PlatformTraits, 8> g_traits(kTraits);

}  // namespace

const PlatformTraits& TraitsOf(Platform platform) {
  const size_t i = static_cast<size_t>(platform);
  // Not a Platform ParsePlatform returns.
  if (i >= g_traits.size()) std::abort();
  return g_traits[i];
}

std::vector<Platform> AllPlatforms() {
  std::vector<Platform> out;
  for (size_t i = 0; i < g_traits.size(); ++i) {
    out.push_back(static_cast<Platform>(i));
  }
  return out;
}

bool AddPlatformTraitsForTest(const PlatformTraits& traits) {
  const size_t next = g_traits.size();
  if (static_cast<size_t>(traits.platform) != next || next >= NumPlatforms()) {
    return false;
  }
  return g_traits.Add(traits);
}

}  // namespace kreg
