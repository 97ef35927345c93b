#include "daemon/types.h"

namespace kreg {

const char* PlatformName(Platform platform) {
  return platform == Platform::kCuda ? "cuda" : "cpu";
}

const char* TargetKindName(TargetKind kind) {
  return kind == TargetKind::kInProcess ? "in-process" : "module";
}

}  // namespace kreg
