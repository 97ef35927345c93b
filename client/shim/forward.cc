#include "client/shim/forward.h"

#include <string.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "client/shim/attr_cache.h"
#include "client/shim/cuda_forward.h"
#include "client/shim/launch_encoder.h"
#include "common/ring_encode.h"
#include "common/status_macros.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace shim {
namespace {

using Forwarder = ClientStatus (*)(Client* client, const std::string& target,
                                   uint32_t generation, uint64_t state,
                                   XLA_FFI_CallFrame* frame);

// The forwarding path of each platform the shim forwards.
constexpr struct {
  const char* platform;  // canonical
  Forwarder forward;
} kForwarders[] = {
    {"cpu", &ForwardCpuCall},
    {"cuda", &ForwardCudaCall},
};

struct Slot {
  Client* client;
  std::string target;
  std::string platform;  // canonical
  uint32_t generation;   // pinned (docs/replace.md §7); 0: the current
  bool stateful;         // a bundle with an instantiate stage
};

// The forwarding entries' own XLA state: the handle of the state the
// executor keeps for the call site (docs/kernel-author-guide.md, "Handler
// bundles and state"). XLA destroys it with the executable; the deleter
// releases the executor's state.
struct ForwardedState {
  Client* client;
  std::string target;
  uint64_t handle;
};

XLA_FFI_TypeId g_forwarded_state_type = {0};

void DeleteForwardedState(void* p) {
  auto* state = static_cast<ForwardedState*>(p);
  // Best effort: a session that ended released the state already.
  state->client->ReleaseState(state->handle);
  delete state;
}

const XLA_FFI_TypeInfo kForwardedStateTypeInfo = {
    XLA_FFI_TypeInfo_STRUCT_SIZE, nullptr, &DeleteForwardedState};

std::atomic<const Slot*> g_slots[kNumSlots];
std::mutex g_bind_mu;
int g_used = 0;  // guarded by g_bind_mu

XLA_FFI_Error* MakeError(const XLA_FFI_Api* api, int code,
                         const char* message) {
  XLA_FFI_Error_Create_Args args;
  memset(&args, 0, sizeof(args));
  args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
  args.message = message;
  args.errc = static_cast<XLA_FFI_Error_Code>(code);
  return api->XLA_FFI_Error_Create(&args);
}

XLA_FFI_Error* MakeError(const XLA_FFI_Api* api, int code,
                         const std::string& message) {
  return MakeError(api, code, message.c_str());
}

// Answers XLA's metadata query: the FFI API of the headers this shim was
// built with, no traits (never command-buffer compatible: a forwarded call
// cannot be captured into the caller's CUDA graph), and for a stateful
// binding the forwarded state's type.
XLA_FFI_Error* PopulateMetadata(const XLA_FFI_Api* api,
                                XLA_FFI_Metadata_Extension* ext,
                                bool stateful) {
  if (ext->extension_base.struct_size <
          XLA_FFI_Metadata_Extension_STRUCT_SIZE ||
      ext->metadata == nullptr ||
      ext->metadata->struct_size < XLA_FFI_Metadata_STRUCT_SIZE) {
    return MakeError(api, kInvalidArgument,
                     "kreg forwarding handler: metadata extension is older "
                     "than the XLA FFI headers it was built with");
  }
  ext->metadata->api_version =
      XLA_FFI_Api_Version{XLA_FFI_Api_Version_STRUCT_SIZE, nullptr,
                          XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR};
  ext->metadata->traits = 0;
  if (stateful && g_forwarded_state_type.type_id == 0) {
    return MakeError(api, kFailedPrecondition,
                     std::string("kreg forwarding handler: register the state "
                                 "type \"") +
                         kForwardedStateType +
                         "\" with XLA (jax.ffi.register_ffi_type) before a "
                         "handler bundle with an instantiate stage");
  }
  ext->metadata->state_type_id =
      stateful ? g_forwarded_state_type : XLA_FFI_TypeId{0};
  return nullptr;
}

// Traced launches not yet taken (KREG_TRACE_STAGES=1), at most
// kMaxTraceRecords (later ones are dropped).
constexpr size_t kMaxTraceRecords = size_t{1} << 18;
std::mutex g_trace_mu;
std::vector<StageRecord> g_trace;

// Runs `forward`, stamping the stages of the call when KREG_TRACE_STAGES=1.
ClientStatus RunForwarder(Forwarder forward, Client* client,
                          const std::string& target,
                          const std::string& platform, uint32_t generation,
                          uint64_t state, XLA_FFI_CallFrame* frame) {
  if (!TracingStages()) {
    return forward(client, target, generation, state, frame);
  }
  stage::Times times{};
  stage::SetCurrent(&times);
  stage::Mark(stage::kEnter);
  ClientStatus s = forward(client, target, generation, state, frame);
  stage::Mark(stage::kReturned);
  stage::SetCurrent(nullptr);
  // Ring launches only (the executor stamps its stages there).
  if (times.ns[stage::kPublished] != 0) {
    std::lock_guard<std::mutex> lock(g_trace_mu);
    if (g_trace.size() < kMaxTraceRecords) {
      g_trace.push_back({platform == "cuda" ? 1 : 0, times});
    }
  }
  return s;
}

// Frees an error XLA's API returned to the shim.
void DestroyFfiError(const XLA_FFI_Api* api, XLA_FFI_Error* err) {
  XLA_FFI_Error_Destroy_Args destroy;
  memset(&destroy, 0, sizeof(destroy));
  destroy.struct_size = XLA_FFI_Error_Destroy_Args_STRUCT_SIZE;
  destroy.error = err;
  api->XLA_FFI_Error_Destroy(&destroy);
}

// The instantiate stage of a stateful slot: kregd's executor runs the real
// one (Client::Instantiate) and keeps the state; XLA keeps the handle.
ClientStatus InstantiateForwarded(const Slot* slot, XLA_FFI_CallFrame* frame) {
  thread_local AttrCache attrs;
  const std::string* encoded;
  KREG_RETURN_IF_ERROR(attrs.Get(&frame->attrs, &encoded));
  ring::DescriptorView d;
  d.target = slot->target;
  d.platform = slot->platform;
  d.generation = slot->generation;
  d.attrs = *encoded;
  uint64_t handle = 0;
  KREG_RETURN_IF_ERROR(slot->client->Instantiate(d, &handle));
  auto* state = new ForwardedState{slot->client, slot->target, handle};
  XLA_FFI_State_Set_Args args;
  memset(&args, 0, sizeof(args));
  args.struct_size = XLA_FFI_State_Set_Args_STRUCT_SIZE;
  args.ctx = frame->ctx;
  args.stage = XLA_FFI_ExecutionStage_INSTANTIATE;
  args.type_id = &g_forwarded_state_type;
  args.state = state;
  if (XLA_FFI_Error* err = frame->api->XLA_FFI_State_Set(&args)) {
    // XLA did not take the state: release it here.
    DeleteForwardedState(state);
    XLA_FFI_Error_GetDetails_Args details;
    memset(&details, 0, sizeof(details));
    details.struct_size = XLA_FFI_Error_GetDetails_Args_STRUCT_SIZE;
    details.error = err;
    frame->api->XLA_FFI_Error_GetDetails(&details);
    std::string message = "kreg forwarding handler for \"" + slot->target +
                          "\": XLA refused the call site's state: " +
                          (details.message != nullptr ? details.message : "");
    DestroyFfiError(frame->api, err);
    return ClientStatus::Error(kInternal, message);
  }
  return ClientStatus::Ok();
}

// The handle of the call site's state (kept by InstantiateForwarded).
// `stage`: the stage State_Get is asked at (the instantiate state is the
// one every stage reads through ffi::State<T>).
ClientStatus ForwardedStateOf(
    const Slot* slot, XLA_FFI_CallFrame* frame, uint64_t* handle,
    XLA_FFI_ExecutionStage stage = XLA_FFI_ExecutionStage_EXECUTE) {
  XLA_FFI_State_Get_Args args;
  memset(&args, 0, sizeof(args));
  args.struct_size = XLA_FFI_State_Get_Args_STRUCT_SIZE;
  args.ctx = frame->ctx;
  args.stage = stage;
  args.type_id = &g_forwarded_state_type;
  if (XLA_FFI_Error* err = frame->api->XLA_FFI_State_Get(&args)) {
    DestroyFfiError(frame->api, err);
    args.state = nullptr;
  }
  if (args.state == nullptr) {
    return ClientStatus::Error(
        kFailedPrecondition,
        "kreg forwarding handler for \"" + slot->target +
            "\": XLA gave this call no state; the target's instantiate stage "
            "did not run (was it registered with JAX as a stage dict?)");
  }
  *handle = static_cast<ForwardedState*>(args.state)->handle;
  return ClientStatus::Ok();
}

// A bundle's prepare or initialize stage (XLA:GPU runs them before each
// execution): kregd's executor runs the real stage with the call site's
// state (docs/kernel-author-guide.md, "Handler bundles and state"). The
// buffers go as shapes only: XLA says reading them in these stages is
// undefined, and their addresses are not the executor's.
ClientStatus StageForwarded(const Slot* slot, XLA_FFI_CallFrame* frame) {
  uint64_t state = 0;
  if (slot->stateful) {
    KREG_RETURN_IF_ERROR(ForwardedStateOf(slot, frame, &state,
                                          XLA_FFI_ExecutionStage_INSTANTIATE));
  }
  thread_local AttrCache attrs;
  const std::string* encoded;
  KREG_RETURN_IF_ERROR(attrs.Get(&frame->attrs, &encoded));
  std::vector<ring::BufferView> buffers;
  buffers.reserve(static_cast<size_t>(frame->args.size + frame->rets.size));
  KREG_RETURN_IF_ERROR(ForEachBuffer(
      frame, [&](const XLA_FFI_Buffer* b, uint64_t bytes, bool /*is_arg*/) {
        ring::BufferView v;
        v.dtype = static_cast<int32_t>(b->dtype);
        v.rank = static_cast<uint32_t>(b->rank);
        v.dims = b->dims;
        v.size = bytes;
        buffers.push_back(v);
      }));
  ring::DescriptorView d;
  d.target = slot->target;
  d.platform = slot->platform;
  d.generation = slot->generation;
  d.state = state;
  d.attrs = *encoded;
  d.args = buffers.data();
  d.num_args = static_cast<uint32_t>(frame->args.size);
  d.rets = buffers.data() + frame->args.size;
  d.num_rets = static_cast<uint32_t>(frame->rets.size);
  CallContext(frame, &d.device_ordinal, &d.run_id);
  if (d.device_ordinal < 0) d.device_ordinal = 0;
  return slot->client->StageCall(d, static_cast<uint32_t>(frame->stage));
}

XLA_FFI_Error* Forward(int index, XLA_FFI_CallFrame* call_frame) {
  const XLA_FFI_Api* api = call_frame->api;
  if (call_frame->struct_size < XLA_FFI_CallFrame_STRUCT_SIZE) {
    return MakeError(api, kInvalidArgument,
                     "kreg forwarding handler: XLA_FFI_CallFrame of size " +
                         std::to_string(call_frame->struct_size) +
                         " is smaller than expected " +
                         std::to_string(XLA_FFI_CallFrame_STRUCT_SIZE));
  }
  const Slot* slot = g_slots[index].load(std::memory_order_acquire);
  if (call_frame->extension_start != nullptr &&
      call_frame->extension_start->type == XLA_FFI_Extension_Metadata) {
    return PopulateMetadata(api,
                            reinterpret_cast<XLA_FFI_Metadata_Extension*>(
                                call_frame->extension_start),
                            slot != nullptr && slot->stateful);
  }
  if (slot == nullptr) {
    return MakeError(api, kInternal,
                     "kreg forwarding handler slot " + std::to_string(index) +
                         " is not bound");
  }
  const bool instantiate =
      call_frame->stage == XLA_FFI_ExecutionStage_INSTANTIATE;
  // Prepare and initialize: XLA calls them only when kreg registered this
  // handler as those stages (the bundle has them).
  const bool staged = call_frame->stage == XLA_FFI_ExecutionStage_PREPARE ||
                      call_frame->stage == XLA_FFI_ExecutionStage_INITIALIZE;
  if (call_frame->stage != XLA_FFI_ExecutionStage_EXECUTE && !staged &&
      !(instantiate && slot->stateful)) {
    return MakeError(api, kInvalidArgument,
                     "kreg forwarding handler for \"" + slot->target +
                         "\" does not forward stage " +
                         std::to_string(call_frame->stage) +
                         (slot->stateful ? " (it forwards instantiate, "
                                           "prepare, initialize and execute)"
                                         : " (it forwards prepare, initialize "
                                           "and execute)"));
  }
  ClientStatus s;
  uint64_t state = 0;
  if (instantiate) {
    s = InstantiateForwarded(slot, call_frame);
  } else if (staged) {
    s = StageForwarded(slot, call_frame);
  } else if (slot->stateful) {
    s = ForwardedStateOf(slot, call_frame, &state);
  }
  if (!instantiate && !staged && s.ok()) {
    // An earlier call's GPU work never completed (its executor died after
    // the handler returned): this call reports it instead of running.
    s = slot->client->TakeLostWork();
    if (!s.ok()) {
      slot->client->launch_errors.fetch_add(1, std::memory_order_relaxed);
    } else {
      s = ForwardCall(slot->client, slot->target, slot->platform, call_frame,
                      slot->generation, state);
    }
  }
  if (s.ok()) return nullptr;
  // An error must never read as OK, nor carry a code XLA does not know.
  if (s.code <= kOk || s.code > 16) s.code = kInternal;
  // The genuine handler's operand decoding names neither the target nor
  // the attribute: add them (user guide, "Errors of a call").
  if (s.code == kInvalidArgument) {
    s.message = ExplainDecodeError(slot->target, slot->platform,
                                   call_frame->attrs, s.message);
  }
  return MakeError(api, s.code, s.message);
}

// XLA calls the handler through a C function pointer: nothing may unwind
// out of it (that would std::terminate the JAX process). Every exception
// becomes an XLA FFI error.
XLA_FFI_Error* ForwardNoThrow(int index, XLA_FFI_CallFrame* call_frame) {
  const XLA_FFI_Api* api = call_frame->api;
  const char* what = nullptr;
  try {
    return Forward(index, call_frame);
  } catch (const std::exception& e) {
    try {
      return MakeError(api, kInternal,
                       std::string("kreg forwarding handler failed: C++ "
                                   "exception: ") +
                           e.what());
    } catch (...) {
      what = "kreg forwarding handler failed: C++ exception (out of memory?)";
    }
  } catch (...) {
    what = "kreg forwarding handler failed: unknown C++ exception";
  }
  return MakeError(api, kInternal, what);
}

template <int I>
XLA_FFI_Error* Trampoline(XLA_FFI_CallFrame* call_frame) {
  return ForwardNoThrow(I, call_frame);
}

template <int... I>
constexpr std::array<XLA_FFI_Handler*, sizeof...(I)> MakeTable(
    std::integer_sequence<int, I...>) {
  return {&Trampoline<I>...};
}

constexpr std::array<XLA_FFI_Handler*, kNumSlots> kTrampolines =
    MakeTable(std::make_integer_sequence<int, kNumSlots>());

// Re-pointable entries: the handler of each slot, and the slots taken.
std::atomic<XLA_FFI_Handler*> g_repointable[kNumRepointSlots];
int g_repointable_used = 0;  // guarded by g_bind_mu

template <int I>
XLA_FFI_Error* RepointableEntry(XLA_FFI_CallFrame* call_frame) {
  return g_repointable[I].load(std::memory_order_acquire)(call_frame);
}

template <int... I>
constexpr std::array<XLA_FFI_Handler*, sizeof...(I)> MakeRepointableTable(
    std::integer_sequence<int, I...>) {
  return {&RepointableEntry<I>...};
}

constexpr std::array<XLA_FFI_Handler*, kNumRepointSlots> kRepointableEntries =
    MakeRepointableTable(std::make_integer_sequence<int, kNumRepointSlots>());

}  // namespace

ClientStatus Bind(Client* client, const std::string& target,
                  const std::string& platform, uint32_t generation,
                  Binding* out, bool stateful) {
  std::string canonical = CanonicalPlatform(platform);
  if (generation > 0) {
    KREG_RETURN_IF_ERROR(
        CheckGeneration(client, target, canonical, generation));
  }
  std::lock_guard<std::mutex> lock(g_bind_mu);
  for (int i = 0; i < g_used; ++i) {
    const Slot* s = g_slots[i].load(std::memory_order_relaxed);
    if (s->target == target && s->platform == canonical) {
      if (s->client != client) {
        return ClientStatus::Error(
            kFailedPrecondition,
            "target \"" + target + "\" (" + canonical +
                ") is already bound to the kregd at " + s->client->path() +
                "; a process can forward a target to one daemon only");
      }
      if (s->generation != generation) {
        return OtherGeneration(target, canonical, s->generation, generation);
      }
      if (s->stateful != stateful) {
        return ClientStatus::Error(
            kFailedPrecondition,
            "target \"" + target + "\" (" + canonical +
                ") is already bound in this process " +
                (s->stateful ? "as a handler bundle with an instantiate stage"
                             : "without an instantiate stage") +
                "; its registration changed meanwhile");
      }
      out->handler = reinterpret_cast<void*>(kTrampolines[i]);
      out->slot = i;
      return ClientStatus::Ok();
    }
  }
  if (g_used == kNumSlots) {
    return ClientStatus::Error(
        kResourceExhausted,
        "cannot bind \"" + target + "\": all " + std::to_string(kNumSlots) +
            " kreg forwarding handler slots of this process are in use "
            "(one per registered (target, platform))");
  }
  int i = g_used++;
  g_slots[i].store(new Slot{client, target, canonical, generation, stateful},
                   std::memory_order_release);
  out->handler = reinterpret_cast<void*>(kTrampolines[i]);
  out->slot = i;
  return ClientStatus::Ok();
}

XLA_FFI_TypeId* ForwardedStateTypeId() { return &g_forwarded_state_type; }
const XLA_FFI_TypeInfo* ForwardedStateTypeInfo() {
  return &kForwardedStateTypeInfo;
}

ClientStatus ForwardCall(Client* client, const std::string& target,
                         const std::string& platform, XLA_FFI_CallFrame* frame,
                         uint32_t generation, uint64_t state) {
  for (const auto& f : kForwarders) {
    if (platform == f.platform) {
      return RunForwarder(f.forward, client, target, platform, generation,
                          state, frame);
    }
  }
  return ClientStatus::Error(kUnimplemented, "kreg: forwarding " + platform +
                                                 " calls of \"" + target +
                                                 "\" is not supported");
}

bool TracingStages() {
  static const bool on = [] {
    const char* v = ::getenv("KREG_TRACE_STAGES");
    return v != nullptr && strcmp(v, "1") == 0;
  }();
  return on;
}

std::vector<StageRecord> TakeStageRecords(size_t max) {
  std::lock_guard<std::mutex> lock(g_trace_mu);
  const size_t n = std::min(max, g_trace.size());
  std::vector<StageRecord> out(g_trace.begin(), g_trace.begin() + n);
  g_trace.erase(g_trace.begin(), g_trace.begin() + n);
  return out;
}

ClientStatus BindRepointable(const std::string& target,
                             const std::string& platform, void* handler,
                             int* slot, void** entry) {
  std::lock_guard<std::mutex> lock(g_bind_mu);
  if (g_repointable_used == kNumRepointSlots) {
    return ClientStatus::Error(
        kResourceExhausted,
        "cannot bind \"" + target + "\" (" + platform + ") locally: all " +
            std::to_string(kNumRepointSlots) +
            " re-pointable entries of this process are in use (one per "
            "replaceable target bound locally); run it isolated "
            "(execution=\"isolated\") or in another process");
  }
  const int i = g_repointable_used++;
  SetRepointable(i, handler);
  *slot = i;
  *entry = reinterpret_cast<void*>(kRepointableEntries[i]);
  return ClientStatus::Ok();
}

void SetRepointable(int slot, void* handler) {
  g_repointable[slot].store(reinterpret_cast<XLA_FFI_Handler*>(handler),
                            std::memory_order_release);
}

int SlotsUsed() {
  std::lock_guard<std::mutex> lock(g_bind_mu);
  return g_used;
}

}  // namespace shim
}  // namespace kreg
