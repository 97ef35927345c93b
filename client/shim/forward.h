// Forwarding XLA FFI handlers: a table of pre-instantiated trampolines, one
// slot per bound (target, platform), each forwarding its calls to kregd.
#ifndef KREGD_CLIENT_SHIM_FORWARD_H_
#define KREGD_CLIENT_SHIM_FORWARD_H_

#include <string>

#include "client/shim/client.h"
#include "common/status.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace shim {

// Number of trampoline slots (distinct (target, platform) per process).
constexpr int kNumSlots = 256;

struct Binding {
  void* handler = nullptr;  // XLA_FFI_Handler*
  int slot = -1;
};

// Binds (target, platform) to a slot forwarding to `client`. The same
// binding for the same (target, canonical platform). RESOURCE_EXHAUSTED
// when all kNumSlots slots are taken; FAILED_PRECONDITION when the pair is
// bound to another client. Thread-safe.
ClientStatus Bind(Client* client, const std::string& target,
                  const std::string& platform, Binding* out);

int SlotsUsed();

// Forwards one EXECUTE-stage call of (target, canonical platform) with the
// forwarder of its platform (cpu: ForwardCpuCall, cuda: ForwardCudaCall);
// UNIMPLEMENTED for any other platform.
ClientStatus ForwardCall(Client* client, const std::string& target,
                         const std::string& platform, XLA_FFI_CallFrame* frame);

}  // namespace shim
}  // namespace kreg

#endif  // KREGD_CLIENT_SHIM_FORWARD_H_
