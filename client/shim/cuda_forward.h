// Forwarding of CUDA calls (DESIGN §3): XLA's device buffers are shared
// with kregd zero-copy (VMM POSIX fd or legacy IPC, cached per session) or
// staged through an exportable buffer; XLA's stream and kregd's session
// stream are ordered by a pair of interprocess events. No host-side GPU
// synchronisation on the path.
#ifndef KREGD_CLIENT_SHIM_CUDA_FORWARD_H_
#define KREGD_CLIENT_SHIM_CUDA_FORWARD_H_

#include <functional>
#include <string>

#include "client/shim/client.h"
#include "common/status.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace shim {

// The CUDA state of one session (Conn): the allocations shared with kregd
// (an LRU bounded by the daemon's max_cuda_mappings, each holding a
// retained handle), the event pair and staging buffer of each device.
// Defined in cuda_conn_state.cc; destroyed with its Conn (not after a fork:
// CUDA objects of the parent are leaked in a child, never touched).
class CudaConnState;
void DestroyCudaConnState(CudaConnState* state);
// Whether an XLA stream may still wait on a doorbell of the state (its last
// launch's use has not passed): the Client's idle watch watches such
// sessions, so that an executor that dies meanwhile cannot leave the
// stream waiting forever.
bool CudaConnStateAwaitsExecutor(const CudaConnState* state);
// The session has ended (Conn::ended()): releases every doorbell wait the
// executor will never answer (Doorbell::Abandon). True when a launch's GPU
// work never completed; `on_lost` is then called with the device's UUID
// ("GPU-...") before that device's wait is released.
bool AbandonCudaConnState(
    CudaConnState* state,
    const std::function<void(const std::string& device)>& on_lost);

// Forgets every allocation the state says kregd holds (without telling
// kregd): the next call shares its buffers again. For a completion that
// said kregd no longer holds one (ring::kMappingMissing).
void ForgetCudaMappings(CudaConnState* state);

// Forwards an EXECUTE-stage call of a CUDA target: the Launch carries, per
// buffer, its allocation and offset; kregd runs the handler on its session
// stream after XLA's preceding work and XLA's later work runs after it.
ClientStatus ForwardCudaCall(Client* client, const std::string& target,
                             uint32_t generation, uint64_t state,
                             XLA_FFI_CallFrame* frame);

}  // namespace shim
}  // namespace kreg

#endif  // KREGD_CLIENT_SHIM_CUDA_FORWARD_H_
