// The CUDA state of a session as the session and the Client see it: made,
// watched and released without knowing what it holds (cuda_conn_state.cc
// defines it; cuda_forward.cc fills it). Internal to //client/shim.
#ifndef KREGD_CLIENT_SHIM_CUDA_SESSION_H_
#define KREGD_CLIENT_SHIM_CUDA_SESSION_H_

#include <functional>
#include <string>

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

}  // namespace shim
}  // namespace kreg

#endif  // KREGD_CLIENT_SHIM_CUDA_SESSION_H_
