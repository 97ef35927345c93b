// The upgrade tests' kregd (DESIGN §12, tests/python/test_orphans.py):
// kregd as if built with the next session-protocol major. Overrides the
// weak definitions of daemon/supervisor/protocol_of_build.cc.
#include "daemon/base/adoption.h"
#include "daemon/base/protocol_version.h"

namespace kreg {

uint32_t AdoptableProtocolMajor() { return kSessionProtocolMajor + 1; }
uint32_t AdoptableProtocolMinor() { return 0; }

}  // namespace kreg
