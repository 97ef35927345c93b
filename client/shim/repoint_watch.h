// The shim's watch connection (docs/replace.md section 4): kregd's Repoint
// notices for the targets this process holds locally and may see replaced.
// The control connection is request/reply, so the notices come on a
// connection of their own, served by a thread of the shim.
#ifndef KREGD_CLIENT_SHIM_REPOINT_WATCH_H_
#define KREGD_CLIENT_SHIM_REPOINT_WATCH_H_

#include <string>

#include "common/status.h"

namespace kreg {
namespace shim {

// Makes this process watch the kregd at `session_path`: the first call per
// path and process opens the watch connection (a control connection whose
// request is watch) and starts the thread that serves it (ServeRepoints;
// reopened with backoff when it ends, e.g. kregd restarted). kregd's
// refusal of the watch, or the connection's error, otherwise. Thread-safe.
ClientStatus WatchRepoints(const std::string& session_path);

// Serves the watch connection `sock` (after its WatchReply): applies each
// Repoint notice (ApplyRepoint, with its attached memfd) and answers it
// with a RepointAck of the generation (a pinned binding's: `pinned` set),
// or of the error (also said on stderr). Returns when the connection ends:
// UNAVAILABLE, or kregd's connection-level error, or INTERNAL for a frame that
// is no notice.
ClientStatus ServeRepoints(int sock);

}  // namespace shim
}  // namespace kreg

#endif  // KREGD_CLIENT_SHIM_REPOINT_WATCH_H_
