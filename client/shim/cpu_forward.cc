// The CPU forwarding path: stage the call's buffers in the session arena,
// send the Launch (launch ring or socket), copy the outputs back.
#include <string.h>

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

#include "client/shim/attr_cache.h"
#include "client/shim/conn.h"
#include "client/shim/forward.h"
#include "client/shim/launch_encoder.h"
#include "common/ring_encode.h"
#include "common/stage_trace.h"
#include "common/status_macros.h"

namespace kreg {
namespace shim {
namespace {

constexpr uint64_t kAlign = 64;

struct Region {
  const XLA_FFI_Buffer* buffer;
  uint64_t offset;
  uint64_t bytes;
  bool copy_in;  // false for a region already filled by an earlier arg
};

// Per-thread scratch so a call allocates nothing in steady state.
struct Scratch {
  std::vector<Region> args;
  std::vector<Region> rets;
  std::vector<ring::BufferView> views;  // args, then rets
  AttrCache attrs;
  // The socket path only.
  v1::SessionRequest request;
  v1::SessionResponse response;
};

// memcpy, split over a few threads for large buffers (the copies through
// the arena dominate forwarded calls on big arrays).
void Copy(void* dst, const void* src, uint64_t n) {
  constexpr uint64_t kParallelBytes = 4u << 20;
  static const unsigned kThreads =
      std::min(4u, std::max(1u, std::thread::hardware_concurrency()));
  if (n < kParallelBytes || kThreads == 1) {
    memcpy(dst, src, n);
    return;
  }
  uint64_t chunk = (n / kThreads + 4095) / 4096 * 4096;
  std::vector<std::thread> workers;
  for (unsigned i = 1; i < kThreads && i * chunk < n; ++i) {
    uint64_t off = i * chunk;
    uint64_t len = std::min(chunk, n - off);
    workers.emplace_back([=] {
      memcpy(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off,
             len);
    });
  }
  memcpy(dst, src, std::min(chunk, n));
  for (std::thread& t : workers) t.join();
}

uint64_t AlignUp(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

}  // namespace

ClientStatus ForwardCpuCall(Client* client, const std::string& target,
                            uint32_t generation, uint64_t state,
                            XLA_FFI_CallFrame* frame) {
  thread_local Scratch scratch;
  // Lay out the arena: one region per distinct input buffer; an output whose
  // data pointer is an input's (input_output_aliases) shares its region.
  uint64_t cursor = 0;
  scratch.args.clear();
  scratch.rets.clear();
  scratch.views.clear();
  KREG_RETURN_IF_ERROR(ForEachBuffer(
      frame, [&](const XLA_FFI_Buffer* b, uint64_t bytes, bool is_arg) {
        Region r{b, cursor, bytes, is_arg};
        bool shared = false;  // with an earlier input
        for (const Region& a : scratch.args) {
          if (bytes > 0 && a.buffer->data == b->data && a.bytes == bytes) {
            r.offset = a.offset;
            r.copy_in = false;
            shared = true;
            break;
          }
        }
        if (!shared) cursor = AlignUp(cursor + bytes);
        (is_arg ? scratch.args : scratch.rets).push_back(r);
        scratch.views.push_back(ring::BufferView{static_cast<int32_t>(b->dtype),
                                                 static_cast<uint32_t>(b->rank),
                                                 b->dims, r.offset, bytes});
      }));
  const std::string* attrs;
  KREG_RETURN_IF_ERROR(scratch.attrs.Get(&frame->attrs, &attrs));
  ring::DescriptorView launch;
  launch.target = target;
  launch.platform = "cpu";
  launch.generation = generation;
  launch.state = state;
  launch.args = scratch.views.data();
  launch.num_args = static_cast<uint32_t>(scratch.args.size());
  launch.rets = scratch.views.data() + scratch.args.size();
  launch.num_rets = static_cast<uint32_t>(scratch.rets.size());
  launch.attrs = *attrs;
  CallContext(frame, &launch.device_ordinal, &launch.run_id);

  client->launches.fetch_add(1, std::memory_order_relaxed);
  // One captured pointer: std::function keeps it inline (no allocation).
  struct Call {
    uint64_t arena_bytes;
    const ring::DescriptorView* launch;
    Scratch* scratch;
  } call{cursor, &launch, &scratch};
  thread_local Client::Rerun rerun;
  rerun.target = target;
  ClientStatus s = client->WithConn(
      [c = &call](Conn* conn) {
        KREG_RETURN_IF_ERROR(conn->EnsureArena(c->arena_bytes));
        char* arena = conn->arena();
        for (const Region& r : c->scratch->args) {
          if (r.copy_in && r.bytes > 0) {
            Copy(arena + r.offset, r.buffer->data, r.bytes);
          }
        }
        stage::Mark(stage::kPrepared);  // inputs copied into the arena
        KREG_RETURN_IF_ERROR(conn->LaunchCpu(*c->launch, &c->scratch->request,
                                             &c->scratch->response));
        for (const Region& r : c->scratch->rets) {
          if (r.bytes > 0) Copy(r.buffer->data, arena + r.offset, r.bytes);
        }
        return ClientStatus::Ok();
      },
      &rerun);
  if (!s.ok()) client->launch_errors.fetch_add(1, std::memory_order_relaxed);
  return s;
}

}  // namespace shim
}  // namespace kreg
