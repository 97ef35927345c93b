// The shim's watch connection (docs/replace.md section 4): kregd's Repoint
// notices for the targets this process holds locally and may see replaced.
// The control connection is request/reply, so the notices come on a
// connection of their own, served by a thread of the shim.
#ifndef KREGD_CLIENT_SHIM_REPOINT_WATCH_H_
#define KREGD_CLIENT_SHIM_REPOINT_WATCH_H_

#include <cstdint>
#include <string>

#include "common/status.h"
#include "common/unique_fd.h"

namespace kreg::v1 {
class Repoint;
}  // namespace kreg::v1

namespace kreg {
namespace shim {

// What a notice does to this process's bindings (local_bind.h's
// ApplyRepoint): `*pinned` is set to the generation a pinned binding keeps.
using RepointApplier = ClientStatus (*)(const v1::Repoint& notice,
                                        UniqueFd module, uint32_t* pinned);

// Makes this process watch the kregd at `session_path`: the first call per
// path and process opens the watch connection (a control connection whose
// request is watch) and starts the thread that serves it (ServeRepoints;
// reopened with backoff when it ends, e.g. kregd restarted). kregd's
// refusal of the watch, or the connection's error, otherwise. Thread-safe.
ClientStatus WatchRepoints(const std::string& session_path,
                           RepointApplier apply);

// Serves the watch connection `sock` (after its WatchReply): applies each
// Repoint notice (`apply`, with its attached memfd) and answers it
// with a RepointAck of the generation (a pinned binding's: `pinned` set),
// or of the error (also said on stderr). Returns when the connection ends:
// UNAVAILABLE, or kregd's connection-level error, or INTERNAL for a frame that
// is no notice.
ClientStatus ServeRepoints(int sock, RepointApplier apply);

}  // namespace shim
}  // namespace kreg

#endif  // KREGD_CLIENT_SHIM_REPOINT_WATCH_H_
