// The session-protocol version kregd adopts executors of (adoption.h):
// weak, so that the upgrade tests' kregd binaries can say another.
#include "daemon/base/adoption.h"
#include "daemon/base/protocol_version.h"

namespace kreg {

__attribute__((weak)) uint32_t AdoptableProtocolMajor() {
  return kSessionProtocolMajor;
}
__attribute__((weak)) uint32_t AdoptableProtocolMinor() {
  return kSessionProtocolMinor;
}

}  // namespace kreg
