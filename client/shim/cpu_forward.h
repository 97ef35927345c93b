// Forwarding of CPU calls (DESIGN §3): inputs are copied into the session's
// shared-memory arena (aliased input/output pairs share one region holding
// the input's values), the Launch goes over the launch ring (or the socket),
// and the outputs are copied back.
#ifndef KREGD_CLIENT_SHIM_CPU_FORWARD_H_
#define KREGD_CLIENT_SHIM_CPU_FORWARD_H_

#include <string>

#include "client/shim/client.h"
#include "common/status.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace shim {

// Forwards an EXECUTE-stage call of a CPU target. The daemon's or the
// handler's error comes back verbatim.
ClientStatus ForwardCpuCall(Client* client, const std::string& target,
                            XLA_FFI_CallFrame* frame);

}  // namespace shim
}  // namespace kreg

#endif  // KREGD_CLIENT_SHIM_CPU_FORWARD_H_
