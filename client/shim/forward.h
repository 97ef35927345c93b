// Forwarding XLA FFI handlers: a table of pre-instantiated trampolines, one
// slot per bound (target, platform), each forwarding its calls to kregd.
#ifndef KREGD_CLIENT_SHIM_FORWARD_H_
#define KREGD_CLIENT_SHIM_FORWARD_H_

#include <string>
#include <vector>

#include "client/shim/client.h"
#include "common/stage_trace.h"
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

// Binds (target, platform) to a slot forwarding to `client`; with
// `generation` > 0 every call asks for that generation (a pin,
// docs/replace.md §7), which kregd must have (asked through Client::List:
// NOT_FOUND listing those it has). The same binding for the same (target,
// canonical platform). RESOURCE_EXHAUSTED when all kNumSlots slots are
// taken; FAILED_PRECONDITION when the pair is bound to another client or
// at another generation. Thread-safe.
// `stateful`: the target is a handler bundle with an instantiate stage
// (docs/kernel-author-guide.md, "Handler bundles and state"): XLA gets the
// slot's entry as both its instantiate and its execute handler. The
// instantiate stage forwards to kregd's executor, which keeps the real
// state under a handle; the entry keeps that handle as its own XLA state
// (type kForwardedStateType, which must be registered with XLA first:
// ForwardedStateType), released in the executor when XLA destroys it.
ClientStatus Bind(Client* client, const std::string& target,
                  const std::string& platform, uint32_t generation,
                  Binding* out, bool stateful = false);

// The name, XLA_FFI_TypeId and XLA_FFI_TypeInfo of the forwarding entries'
// own state type, to register with XLA (jax.ffi.register_ffi_type) before
// a stateful binding's handler.
constexpr char kForwardedStateType[] = "kreg.ForwardedState";
XLA_FFI_TypeId* ForwardedStateTypeId();
const XLA_FFI_TypeInfo* ForwardedStateTypeInfo();

int SlotsUsed();

// Re-pointable entries (docs/replace.md section 4): for a target bound
// locally that kregd may replace, XLA gets the entry of a slot whose body
// loads the slot's handler (an atomic, acquire) and calls it, so
// SetRepointable moves compiled executables to a new handler at their next
// call; a call that loaded the old handler finishes on it.
constexpr int kNumRepointSlots = 256;
// Takes a slot calling `handler` for (target, platform): its index in
// `*slot` and its entry (an XLA_FFI_Handler*) in `*entry`.
// RESOURCE_EXHAUSTED when all kNumRepointSlots are taken. Thread-safe.
ClientStatus BindRepointable(const std::string& target,
                             const std::string& platform, void* handler,
                             int* slot, void** entry);
// Calls to `slot`'s entry go to `handler` from now on (release).
void SetRepointable(int slot, void* handler);

// Stage tracing (KREG_TRACE_STAGES=1 in the environment, for bench/): each
// forwarded call that went on the launch ring leaves its client and
// executor stage stamps (common/stage_trace.h).
bool TracingStages();
struct StageRecord {
  int platform;  // 0 cpu, 1 cuda
  stage::Times times;
};
// Takes (and forgets) up to `max` of the records kept so far, oldest first.
std::vector<StageRecord> TakeStageRecords(size_t max);

// Forwards one EXECUTE-stage call of (target, canonical platform) with the
// forwarder of its platform (cpu: ForwardCpuCall, cuda: ForwardCudaCall);
// UNIMPLEMENTED for any other platform. `generation` > 0: the pinned
// generation the launch asks for (docs/replace.md §7).
// `state` > 0: the call site's state handle (handler bundles).
ClientStatus ForwardCall(Client* client, const std::string& target,
                         const std::string& platform, XLA_FFI_CallFrame* frame,
                         uint32_t generation = 0, uint64_t state = 0);

// Forwarding of CPU calls (cpu_forward.cc, DESIGN §3): inputs are copied
// into the session's shared-memory arena (aliased input/output pairs share
// one region holding the input's values), the Launch goes over the launch
// ring (or the socket), and the outputs are copied back. The daemon's or
// the handler's error comes back verbatim.
ClientStatus ForwardCpuCall(Client* client, const std::string& target,
                            uint32_t generation, uint64_t state,
                            XLA_FFI_CallFrame* frame);

// Context for XLA FFI's operand-decoding errors (decode_error.cc; user
// guide, "Errors of a call"): the handler's own binding reports "Wrong
// scalar data type: expected F32 but got F64" without saying which target
// or attribute; the shim knows both. Returns `message` (an
// INVALID_ARGUMENT of a call of `target` on `platform`) with the target
// named and, for a decoding failure whose diagnostics quote a wrong
// attribute type, the attribute(s) of `attrs` that have that type. Other
// messages come back unchanged.
std::string ExplainDecodeError(const std::string& target,
                               const std::string& platform,
                               const XLA_FFI_Attrs& attrs,
                               const std::string& message);

}  // namespace shim
}  // namespace kreg

#endif  // KREGD_CLIENT_SHIM_FORWARD_H_
