#include "client/shim/cuda_forward.h"

#include <string.h>

#include <cstdint>
#include <utility>

#include "client/shim/attr_cache.h"
#include "client/shim/conn.h"
#include "client/shim/cuda/cuda_export.h"
#include "client/shim/cuda_conn_state.h"
#include "client/shim/cuda_launch.h"
#include "client/shim/cuda_trace.h"
#include "client/shim/launch_encoder.h"
#include "common/cuda_driver.h"
#include "common/status_macros.h"

namespace kreg {
namespace shim {

namespace {

ClientStatus XlaStream(XLA_FFI_CallFrame* frame, cu::CUstream* stream) {
  const XLA_FFI_Api* api = frame->api;
  XLA_FFI_Stream_Get_Args a;
  memset(&a, 0, sizeof(a));
  a.struct_size = XLA_FFI_Stream_Get_Args_STRUCT_SIZE;
  a.ctx = frame->ctx;
  if (DestroyXlaError(api, api->XLA_FFI_Stream_Get(&a))) {
    return ClientStatus::Error(
        kInternal,
        "kreg: XLA did not give the forwarding handler its "
        "CUDA stream (XLA_FFI_Stream_Get failed)");
  }
  if (a.stream == nullptr) {
    return ClientStatus::Error(kInternal, "kreg: XLA's CUDA stream is null");
  }
  *stream = static_cast<cu::CUstream>(a.stream);
  return ClientStatus::Ok();
}

}  // namespace

ClientStatus ForwardCudaCall(Client* client, const std::string& target,
                             uint32_t generation, uint64_t state,
                             XLA_FFI_CallFrame* frame) {
  ClientStatus cs;
  const cu::CudaDriver* d = cc::ProcessDriver(&cs);
  if (d == nullptr) {
    return ClientStatus::Error(
        kUnavailable,
        "kreg: forwarding CUDA call of \"" + target + "\": " + cs.message);
  }
  // Per-thread scratch: a steady-state call allocates nothing and builds
  // no protobuf (the attribute bytes are cached per call site, as on CPU).
  struct Scratch {
    Call call;
    AttrCache attrs;
    v1::SessionRequest req;  // the socket path only
    v1::SessionResponse resp;
  };
  thread_local Scratch scratch;
  Call& call = scratch.call;
  call.d = d;
  call.bufs.clear();
  call.target = &target;
  KREG_RETURN_IF_ERROR(XlaStream(frame, &call.stream));
  cs = cc::StreamDevice(d, call.stream, &call.ctx, &call.ordinal, &call.uuid);
  if (!cs.ok()) return cs;
  cc::PushContext scope(*d, call.ctx);

  KREG_RETURN_IF_ERROR(ForEachBuffer(
      frame, [&](const XLA_FFI_Buffer* b, uint64_t bytes, bool is_arg) {
        Buf buf;
        buf.is_arg = is_arg;
        buf.data = b->data;
        buf.bytes = bytes;
        buf.dtype = static_cast<int32_t>(b->dtype);
        buf.rank = static_cast<uint32_t>(b->rank);
        buf.dims = b->dims;
        call.bufs.push_back(buf);
      }));
  for (Buf& b : call.bufs) {
    if (b.bytes == 0) continue;
    cs = cc::IdentifyBuffer(d, b.data, &b.id, &b.offset);
    if (!cs.ok()) {
      return ClientStatus::Error(
          cs.code, "kreg: cannot forward a buffer of \"" + target +
                       "\" to kregd: " + cs.message);
    }
    if (b.offset + b.bytes > b.id.size) {
      return ClientStatus::Error(
          kInternal, "kreg: a buffer of " + std::to_string(b.bytes) +
                         " bytes at offset " + std::to_string(b.offset) +
                         " overruns its CUDA allocation of " +
                         std::to_string(b.id.size) + " bytes");
    }
  }
  const std::string* attrs;
  KREG_RETURN_IF_ERROR(scratch.attrs.Get(&frame->attrs, &attrs));
  ring::DescriptorView& launch = call.launch;
  launch = ring::DescriptorView{};
  launch.target = target;
  launch.platform = "cuda";
  launch.generation = generation;
  launch.state = state;
  launch.attrs = *attrs;
  launch.device_uuid = call.uuid;
  launch.device_ordinal = call.ordinal;
  CallContext(frame, &launch.device_ordinal, &launch.run_id);

  client->launches.fetch_add(1, std::memory_order_relaxed);
  Trace("call \"%s\": %lld args, %lld rets, stream %p, device %d",
        target.c_str(), static_cast<long long>(frame->args.size),
        static_cast<long long>(frame->rets.size),
        static_cast<void*>(call.stream), call.ordinal);
  // Outputs written in place over an input: a partly run call may have
  // changed its own inputs, so it is never run again (DESIGN §12).
  thread_local Client::Rerun rerun;
  rerun.target = target;
  rerun.outputs_alias_inputs = false;
  for (const Buf& r : call.bufs) {
    if (r.is_arg || r.bytes == 0) continue;
    const char* r0 = static_cast<const char*>(r.data);
    for (const Buf& a : call.bufs) {
      if (!a.is_arg || a.bytes == 0) continue;
      const char* a0 = static_cast<const char*>(a.data);
      if (r0 < a0 + a.bytes && a0 < r0 + r.bytes) {
        rerun.outputs_alias_inputs = true;
      }
    }
  }
  ClientStatus s = client->WithConn(
      [sc = &scratch](Conn* conn) {  // one pointer: kept inline
        return LaunchOnConn(conn, &sc->call, &sc->req, &sc->resp);
      },
      &rerun);
  if (!s.ok()) client->launch_errors.fetch_add(1, std::memory_order_relaxed);
  Trace("done \"%s\": code %d %s", target.c_str(), s.code, s.message.c_str());
  return s;
}

}  // namespace shim
}  // namespace kreg
