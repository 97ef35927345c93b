#include "daemon/base/types.h"

#include <chrono>

#include "common/platforms.h"

namespace kreg {

const char* PlatformName(Platform platform) {
  const size_t i = static_cast<size_t>(platform);
  return i < NumPlatforms() ? PlatformAt(i).name : "?";
}

std::string Named(const TargetKey& key) {
  return "target \"" + key.name + "\" (" + PlatformName(key.platform) + ")";
}

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

const char* TargetKindName(TargetKind kind) {
  return kind == TargetKind::kInProcess ? "in-process" : "module";
}

}  // namespace kreg
