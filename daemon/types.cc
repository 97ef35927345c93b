#include "daemon/types.h"

namespace kreg {

const char* PlatformName(Platform platform) {
  return platform == Platform::kCuda ? "cuda" : "cpu";
}

}  // namespace kreg
