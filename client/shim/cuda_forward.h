// Forwarding of CUDA calls (DESIGN §3): XLA's device buffers are shared
// with kregd zero-copy (VMM POSIX fd or legacy IPC, cached per session) or
// staged through an exportable buffer; XLA's stream and kregd's session
// stream are ordered by a pair of interprocess events. No host-side GPU
// synchronisation on the path.
#ifndef KREGD_CLIENT_SHIM_CUDA_FORWARD_H_
#define KREGD_CLIENT_SHIM_CUDA_FORWARD_H_

#include <string>

#include "client/shim/client.h"
#include "common/status.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace shim {

// Forwards an EXECUTE-stage call of a CUDA target: the Launch carries, per
// buffer, its allocation and offset; kregd runs the handler on its session
// stream after XLA's preceding work and XLA's later work runs after it.
ClientStatus ForwardCudaCall(Client* client, const std::string& target,
                             uint32_t generation, uint64_t state,
                             XLA_FFI_CallFrame* frame);

}  // namespace shim
}  // namespace kreg

#endif  // KREGD_CLIENT_SHIM_CUDA_FORWARD_H_
