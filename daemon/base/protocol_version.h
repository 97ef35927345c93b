// The session protocol's version (common/session_protocol.h), which
// executors speak with clients; kregd compares it when it re-adopts an
// executor an earlier kregd left running (DESIGN §12).
#ifndef KREGD_DAEMON_BASE_PROTOCOL_VERSION_H_
#define KREGD_DAEMON_BASE_PROTOCOL_VERSION_H_

#include <cstdint>

#include "common/session_protocol.h"

namespace kreg {

// The first minor whose executors kregd re-adopts (an executor of another
// major never is; an older one is drained, DESIGN §12): every 2.x so far.
constexpr uint32_t kOldestAdoptableProtocolMinor = 0;

}  // namespace kreg

#endif  // KREGD_DAEMON_BASE_PROTOCOL_VERSION_H_
