// The CPU forwarding path: stage the call's buffers in the session arena,
// send the Launch (launch ring or socket), copy the outputs back.
#include "client/shim/cpu_forward.h"

#include <string.h>

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

#include "client/shim/conn.h"
#include "client/shim/launch_encoder.h"

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
  v1::SessionRequest request;
  v1::SessionResponse response;
  std::vector<Region> args;
  std::vector<Region> rets;
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
                            XLA_FFI_CallFrame* frame) {
  thread_local Scratch scratch;
  v1::SessionRequest& req = scratch.request;
  req.Clear();
  v1::Launch* launch = req.mutable_launch();
  launch->set_target_name(target);
  launch->set_platform("cpu");

  // Lay out the arena: one region per distinct input buffer; an output whose
  // data pointer is an input's (input_output_aliases) shares its region.
  uint64_t cursor = 0;
  scratch.args.clear();
  scratch.rets.clear();
  ClientStatus s = EncodeBuffers(
      frame, launch,
      [&](const XLA_FFI_Buffer* b, uint64_t bytes, bool is_arg,
          v1::Buffer* out) {
        Region r{b, cursor, bytes, is_arg};
        if (is_arg) {
          for (const Region& prev : scratch.args) {
            if (bytes > 0 && prev.buffer->data == b->data &&
                prev.bytes == bytes) {
              r.offset = prev.offset;
              r.copy_in = false;
              break;
            }
          }
          if (r.copy_in) cursor = AlignUp(cursor + bytes);
          scratch.args.push_back(r);
        } else {
          bool aliased = false;
          for (const Region& a : scratch.args) {
            if (bytes > 0 && a.buffer->data == b->data && a.bytes == bytes) {
              r.offset = a.offset;
              aliased = true;
              break;
            }
          }
          if (!aliased) cursor = AlignUp(cursor + bytes);
          scratch.rets.push_back(r);
        }
        out->set_offset(r.offset);
      });
  if (!s.ok()) return s;
  s = EncodeAttrs(&frame->attrs, launch->mutable_attrs());
  if (!s.ok()) return s;
  int32_t ordinal = 0;
  int64_t run_id = 0;
  CallContext(frame, &ordinal, &run_id);
  launch->set_device_ordinal(ordinal);
  launch->set_run_id(run_id);

  client->launches.fetch_add(1, std::memory_order_relaxed);
  s = client->WithConn([&](Conn* conn) {
    ClientStatus st = conn->EnsureArena(cursor);
    if (!st.ok()) return st;
    char* arena = conn->arena();
    for (const Region& r : scratch.args) {
      if (r.copy_in && r.bytes > 0) {
        Copy(arena + r.offset, r.buffer->data, r.bytes);
      }
    }
    st = conn->Launch(&req, &scratch.response);
    if (!st.ok()) return st;
    for (const Region& r : scratch.rets) {
      if (r.bytes > 0) Copy(r.buffer->data, arena + r.offset, r.bytes);
    }
    return st;
  });
  if (!s.ok()) client->launch_errors.fetch_add(1, std::memory_order_relaxed);
  return s;
}

}  // namespace shim
}  // namespace kreg
