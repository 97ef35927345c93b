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

// Binds (target, platform) to a slot forwarding to `client`. The same
// binding for the same (target, canonical platform). RESOURCE_EXHAUSTED
// when all kNumSlots slots are taken; FAILED_PRECONDITION when the pair is
// bound to another client. Thread-safe.
ClientStatus Bind(Client* client, const std::string& target,
                  const std::string& platform, Binding* out);

int SlotsUsed();

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
// UNIMPLEMENTED for any other platform.
ClientStatus ForwardCall(Client* client, const std::string& target,
                         const std::string& platform, XLA_FFI_CallFrame* frame);

}  // namespace shim
}  // namespace kreg

#endif  // KREGD_CLIENT_SHIM_FORWARD_H_
