// Fuzzes RingDecoder::Decode, the executor's edge for launch descriptors
// (a client may write anything into its ring slots at any time, or send
// anything as a socket Launch's descriptor). Input: 4 bytes of the expected
// sequence number (0xffffffff: the descriptor came in a socket Launch, no
// sequence number), then the descriptor bytes. Each input is decoded twice by
// one decoder (the second pass exercises its attribute cache) and once by a
// fresh one; every decoded CPU buffer must lie inside the arena and is read or
// written in full, and the two decoders must agree. A decoded launch then runs
// through FfiHost twice, the long-lived decoder's with one long-lived
// CallFrameCache (as an executor session does) and the fresh one's without: the
// handler must see the same call frame both times. CUDA descriptors (ring
// layout version 2) are also decoded with a fake device resolver (4 KiB per
// allocation of a 16-byte device UUID): each decoded CUDA buffer must lie
// inside it and is read in full.
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "common/dtype.h"
#include "daemon/executor/ffi/ffi_host.h"
#include "daemon/executor/ring_decoder.h"
#include "tests/fuzz/buffer_check.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

constexpr uint64_t kArenaBytes = 64 << 10;

kreg::ShmArena* Arena() {
  static kreg::ShmArena* arena = [] {
    auto* a = new kreg::ShmArena(1 << 20);
    if (!a->Replace(kreg::fuzz::SealedMemfd(kArenaBytes), kArenaBytes).ok()) {
      kreg::fuzz::Fail("arena");
    }
    return a;
  }();
  return arena;
}

// Everything a handler can read from its frame but the data, as bytes.
void DigestAttrs(const XLA_FFI_Attrs& a, int depth, std::string* out) {
  auto put = [out](const void* p, size_t n) {
    out->append(static_cast<const char*>(p), n);
  };
  put(&a.size, sizeof(a.size));
  for (int64_t i = 0; i < a.size; ++i) {
    put(&a.types[i], sizeof(a.types[i]));
    put(&a.names[i]->len, sizeof(size_t));
    put(a.names[i]->ptr, a.names[i]->len);
    switch (a.types[i]) {
      case XLA_FFI_AttrType_SCALAR: {
        auto* v = static_cast<const XLA_FFI_Scalar*>(a.attrs[i]);
        put(&v->dtype, sizeof(v->dtype));
        int w = kreg::DtypeByteWidth(v->dtype);
        if (w > 0) put(v->value, static_cast<size_t>(w));
        break;
      }
      case XLA_FFI_AttrType_ARRAY: {
        auto* v = static_cast<const XLA_FFI_Array*>(a.attrs[i]);
        put(&v->dtype, sizeof(v->dtype));
        put(&v->size, sizeof(v->size));
        int w = kreg::DtypeByteWidth(v->dtype);
        if (w > 0) put(v->data, v->size * static_cast<size_t>(w));
        break;
      }
      case XLA_FFI_AttrType_STRING: {
        auto* v = static_cast<const XLA_FFI_ByteSpan*>(a.attrs[i]);
        put(&v->len, sizeof(v->len));
        put(v->ptr, v->len);
        break;
      }
      case XLA_FFI_AttrType_DICTIONARY:
        if (depth > 64) kreg::fuzz::Fail("attribute nesting without end");
        DigestAttrs(*static_cast<const XLA_FFI_Attrs*>(a.attrs[i]), depth + 1,
                    out);
        break;
      default:
        kreg::fuzz::Fail("an attribute of unknown type in a call frame");
    }
  }
}

// A fake device allocation of 4 KiB per mapping; a region outside it is
// OUT_OF_RANGE, as in CudaMappingCache.
char g_device[4096];
absl::StatusOr<void*> ResolveCuda(const kreg::CudaRefView& ref, uint64_t offset,
                                  uint64_t size, const std::string& what) {
  uint64_t end;
  if (__builtin_add_overflow(offset, size, &end) || end > sizeof(g_device) ||
      ref.device_uuid.size() != 16) {
    return absl::OutOfRangeError(what + " is out of range");
  }
  return g_device + offset;
}

void CheckCudaFrame(const kreg::LaunchFrame& frame) {
  volatile char sink = 0;
  for (const auto* list : {&frame.args, &frame.rets}) {
    for (const kreg::BufferRef& b : *list) {
      const uint64_t n = kreg::fuzz::BufferBytes(b);
      if (n == 0) continue;
      const char* p = static_cast<const char*>(b.data);
      if (p < g_device || p + n > g_device + sizeof(g_device)) {
        kreg::fuzz::Fail("a decoded CUDA buffer lies outside its allocation");
      }
      for (uint64_t i = 0; i < n; ++i) sink = sink + p[i];
    }
  }
}

std::string g_digest;

XLA_FFI_Error* Digest(XLA_FFI_CallFrame* f) {
  g_digest.clear();
  for (int64_t i = 0; i < f->args.size + f->rets.size; ++i) {
    auto* b = static_cast<const XLA_FFI_Buffer*>(
        i < f->args.size ? f->args.args[i] : f->rets.rets[i - f->args.size]);
    g_digest.append(reinterpret_cast<const char*>(&b->dtype), sizeof(b->dtype));
    g_digest.append(reinterpret_cast<const char*>(&b->data), sizeof(b->data));
    g_digest.append(reinterpret_cast<const char*>(b->dims),
                    static_cast<size_t>(b->rank) * sizeof(int64_t));
  }
  DigestAttrs(f->attrs, 0, &g_digest);
  return nullptr;
}

kreg::FfiHost* Host() {
  static kreg::FfiHost* host = new kreg::FfiHost(kreg::FfiHostOptions{1});
  return host;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kreg::fuzz::QuietLogs();
  Arena();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint32_t raw_seq;
  std::memcpy(&raw_seq, data, 4);
  const std::optional<uint32_t> seq =
      raw_seq == 0xffffffffu ? std::nullopt : std::optional<uint32_t>(raw_seq);
  const char* desc = reinterpret_cast<const char*>(data + 4);
  const size_t len = size - 4;
  kreg::ShmArena* arena = Arena();
  static kreg::RingDecoder* cached = new kreg::RingDecoder();
  kreg::RingDecoder fresh;
  uint64_t tag_fresh = 0;
  absl::StatusOr<const kreg::DecodedLaunch*> want =
      fresh.Decode(desc, len, seq, *arena, &tag_fresh);
  {
    // With CUDA: the header agrees with Decode, and buffers stay inside
    // their allocations.
    static kreg::RingDecoder* with_cuda = new kreg::RingDecoder();
    const kreg::CudaBufferResolver cuda = ResolveCuda;
    uint64_t tag = 0, header_tag = 0;
    absl::StatusOr<kreg::DecodedLaunch*> d =
        with_cuda->Decode(desc, len, seq, *arena, &tag, &cuda);
    absl::StatusOr<kreg::RingLaunchHeader> h =
        with_cuda->Header(desc, len, seq, &header_tag);
    if (tag != header_tag) kreg::fuzz::Fail("Header and Decode tags differ");
    if (d.ok() && !h.ok()) kreg::fuzz::Fail("decoded without a valid header");
    if (!d.ok() && d.status().message().empty()) {
      kreg::fuzz::Fail("error without text");
    }
    if (d.ok() && (*d)->frame.platform == kreg::Platform::kCuda) {
      if ((seq.has_value() && h->doorbell_seq == 0) ||
          h->device_uuid.size() != 16) {
        kreg::fuzz::Fail("a CUDA descriptor without doorbell or device");
      }
      CheckCudaFrame((*d)->frame);
    }
  }
  for (int pass = 0; pass < 2; ++pass) {
    uint64_t tag = 0;
    absl::StatusOr<const kreg::DecodedLaunch*> d =
        cached->Decode(desc, len, seq, *arena, &tag);
    if (d.ok() != want.ok() || tag != tag_fresh) {
      kreg::fuzz::Fail("the attribute cache changed a decoding");
    }
    if (!d.ok()) {
      if (d.status().message().empty()) kreg::fuzz::Fail("error without text");
      if (d.status() != want.status()) kreg::fuzz::Fail("errors differ");
      continue;
    }
    absl::StatusOr<char*> base = arena->Region(0, 0);
    kreg::fuzz::CheckCpuFrame((*d)->frame, *base, arena->size());
    if ((*d)->frame.attrs.size() != (*want)->frame.attrs.size() ||
        (*d)->key.name != (*want)->key.name) {
      kreg::fuzz::Fail("the attribute cache changed a decoding");
    }
    static kreg::CallFrameCache* frames = new kreg::CallFrameCache();
    kreg::CallOptions cached;
    cached.frame_cache = frames;
    absl::Status ran =
        Host()->Execute(reinterpret_cast<void*>(&Digest), (*d)->frame, cached);
    const std::string seen = g_digest;
    absl::Status ran_fresh =
        Host()->Execute(reinterpret_cast<void*>(&Digest), (*want)->frame);
    if (ran.ok() != ran_fresh.ok() ||
        (!ran.ok() && ran.message() != ran_fresh.message())) {
      kreg::fuzz::Fail("the call frame cache changed an outcome");
    }
    if (ran.ok() && seen != g_digest) {
      kreg::fuzz::Fail("the call frame cache changed a call frame");
    }
  }
  return 0;
}
