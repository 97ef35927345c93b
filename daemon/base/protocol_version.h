// The session protocol's version (common/session_protocol.h), which
// executors speak with clients; kregd compares it when it re-adopts an
// executor an earlier kregd left running (DESIGN §12).
#ifndef KREGD_DAEMON_BASE_PROTOCOL_VERSION_H_
#define KREGD_DAEMON_BASE_PROTOCOL_VERSION_H_

#include "common/session_protocol.h"

#endif  // KREGD_DAEMON_BASE_PROTOCOL_VERSION_H_
