#include "client/shim/launch_encoder.h"

#include <string.h>

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

#include "client/shim/cuda_forward.h"
#include "common/dtype.h"

namespace kreg {
namespace shim {
namespace {

constexpr uint64_t kAlign = 64;
constexpr int kMaxDepth = 8;

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

}  // namespace

ClientStatus BufferBytes(const XLA_FFI_Buffer* b, const char* kind, int64_t i,
                         uint64_t* bytes) {
  int width = DtypeByteWidth(b->dtype);
  if (width <= 0) {
    return ClientStatus::Error(
        kInvalidArgument, std::string("kreg cannot forward ") + kind + " " +
                              std::to_string(i) + ": dtype " +
                              DtypeName(b->dtype) + " (code " +
                              std::to_string(b->dtype) + ") has no byte width");
  }
  uint64_t n = static_cast<uint64_t>(width);
  for (int64_t d = 0; d < b->rank; ++d) {
    if (b->dims[d] < 0 ||
        __builtin_mul_overflow(n, static_cast<uint64_t>(b->dims[d]), &n)) {
      return ClientStatus::Error(
          kInvalidArgument, std::string("kreg cannot forward ") + kind + " " +
                                std::to_string(i) + ": bad dims");
    }
  }
  *bytes = n;
  return ClientStatus::Ok();
}

void EncodeBufferShape(const XLA_FFI_Buffer* b, uint64_t bytes,
                       v1::Buffer* out) {
  out->set_dtype(b->dtype);
  out->mutable_dims()->Reserve(static_cast<int>(b->rank));
  for (int64_t d = 0; d < b->rank; ++d) out->add_dims(b->dims[d]);
  out->set_size(bytes);
}

namespace {

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

void CallContext(const XLA_FFI_CallFrame* f, int32_t* ordinal,
                 int64_t* run_id) {
  const XLA_FFI_Api* api = f->api;
  auto destroy = [api](XLA_FFI_Error* e) {
    if (e == nullptr) return false;
    XLA_FFI_Error_Destroy_Args d;
    memset(&d, 0, sizeof(d));
    d.struct_size = XLA_FFI_Error_Destroy_Args_STRUCT_SIZE;
    d.error = e;
    api->XLA_FFI_Error_Destroy(&d);
    return true;
  };
  if (api->struct_size >= XLA_FFI_Api_STRUCT_SIZE) {
    XLA_FFI_DeviceOrdinal_Get_Args o;
    memset(&o, 0, sizeof(o));
    o.struct_size = XLA_FFI_DeviceOrdinal_Get_Args_STRUCT_SIZE;
    o.ctx = f->ctx;
    if (!destroy(api->XLA_FFI_DeviceOrdinal_Get(&o))) {
      *ordinal = o.device_ordinal;
    }
    XLA_FFI_RunId_Get_Args r;
    memset(&r, 0, sizeof(r));
    r.struct_size = XLA_FFI_RunId_Get_Args_STRUCT_SIZE;
    r.ctx = f->ctx;
    if (!destroy(api->XLA_FFI_RunId_Get(&r))) *run_id = r.run_id;
  }
}

ClientStatus EncodeAttrs(const XLA_FFI_Attrs* attrs,
                         google::protobuf::RepeatedPtrField<v1::Attribute>* out,
                         int depth) {
  if (depth > kMaxDepth) {
    return ClientStatus::Error(
        kInvalidArgument,
        "kreg cannot forward attribute dictionaries nested "
        "deeper than " +
            std::to_string(kMaxDepth));
  }
  for (int64_t i = 0; i < attrs->size; ++i) {
    v1::Attribute* a = out->Add();
    const XLA_FFI_ByteSpan* name = attrs->names[i];
    a->set_name(name->ptr, name->len);
    const void* value = attrs->attrs[i];
    switch (attrs->types[i]) {
      case XLA_FFI_AttrType_SCALAR: {
        auto* s = static_cast<const XLA_FFI_Scalar*>(value);
        int width = DtypeByteWidth(s->dtype);
        if (width <= 0) {
          return ClientStatus::Error(kInvalidArgument,
                                     "kreg cannot forward scalar attribute \"" +
                                         a->name() + "\" of dtype code " +
                                         std::to_string(s->dtype));
        }
        a->set_kind(v1::ATTR_KIND_SCALAR);
        a->set_dtype(s->dtype);
        a->set_data(static_cast<const char*>(s->value), width);
        break;
      }
      case XLA_FFI_AttrType_ARRAY: {
        auto* arr = static_cast<const XLA_FFI_Array*>(value);
        int width = DtypeByteWidth(arr->dtype);
        if (width <= 0) {
          return ClientStatus::Error(kInvalidArgument,
                                     "kreg cannot forward array attribute \"" +
                                         a->name() + "\" of dtype code " +
                                         std::to_string(arr->dtype));
        }
        a->set_kind(v1::ATTR_KIND_ARRAY);
        a->set_dtype(arr->dtype);
        a->set_count(static_cast<int64_t>(arr->size));
        a->set_data(static_cast<const char*>(arr->data), arr->size * width);
        break;
      }
      case XLA_FFI_AttrType_STRING: {
        auto* span = static_cast<const XLA_FFI_ByteSpan*>(value);
        a->set_kind(v1::ATTR_KIND_STRING);
        a->set_data(span->ptr, span->len);
        break;
      }
      case XLA_FFI_AttrType_DICTIONARY: {
        a->set_kind(v1::ATTR_KIND_DICT);
        ClientStatus s = EncodeAttrs(static_cast<const XLA_FFI_Attrs*>(value),
                                     a->mutable_dict(), depth + 1);
        if (!s.ok()) return s;
        break;
      }
      default:
        return ClientStatus::Error(
            kInvalidArgument, "kreg cannot forward attribute \"" + a->name() +
                                  "\" of type " +
                                  std::to_string(attrs->types[i]));
    }
  }
  return ClientStatus::Ok();
}

ClientStatus ForwardCall(Client* client, const std::string& target,
                         const std::string& platform,
                         XLA_FFI_CallFrame* frame) {
  // An earlier call's GPU work never completed (its executor died after
  // the handler returned): this call reports it instead of running.
  if (ClientStatus lost = client->TakeLostWork(); !lost.ok()) {
    client->launch_errors.fetch_add(1, std::memory_order_relaxed);
    return lost;
  }
  if (platform == "cuda") return ForwardCudaCall(client, target, frame);
  if (platform != "cpu") {
    return ClientStatus::Error(kUnimplemented, "kreg: forwarding " + platform +
                                                   " calls of \"" + target +
                                                   "\" is not supported");
  }
  thread_local Scratch scratch;
  v1::SessionRequest& req = scratch.request;
  req.Clear();
  v1::Launch* launch = req.mutable_launch();
  launch->set_target_name(target);
  launch->set_platform(platform);

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
