// The one launch decoder: a descriptor taken off the ring gets every check
// a socket Launch's descriptor gets, with the same code and message, plus
// the ring's own (sequence number, doorbell); and the socket's framing.
#include "daemon/executor/ring_decoder.h"

#include <string.h>

#include <functional>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/ring_layout.h"
#include "common/wire.h"
#include "daemon/executor/launch_fields.h"
#include "tests/daemon/executor/decode_fixture.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace {

using ::kreg::testing::Arena;
using ::kreg::testing::BufferSpec;
using ::kreg::testing::EncodeSpec;
using ::kreg::testing::LaunchSpec;
using ::kreg::testing::SocketDecode;

LaunchSpec ValidLaunch() {
  LaunchSpec l;
  l.set_target_name("demo.scale");
  l.set_platform("cpu");
  for (auto* b : {l.add_args(), l.add_rets()}) {
    b->set_dtype(XLA_FFI_DataType_F32);
    b->add_dims(2);
    b->add_dims(3);
    b->set_size(24);
  }
  l.mutable_rets(0)->set_offset(64);
  v1::Attribute* a = l.add_attrs();
  a->set_name("factor");
  a->set_kind(v1::ATTR_KIND_SCALAR);
  a->set_dtype(XLA_FFI_DataType_F32);
  float two = 2.0f;
  a->set_data(&two, 4);
  l.set_device_ordinal(0);
  l.set_run_id(9);
  return l;
}

std::string Encode(const LaunchSpec& l, uint32_t seq = 0, uint64_t tag = 42) {
  return EncodeSpec(l, seq, tag);
}

absl::Status RingStatus(const LaunchSpec& l, const ShmArena& arena) {
  RingDecoder d;
  uint64_t tag;
  std::string bytes = Encode(l);
  return d.Decode(bytes.data(), bytes.size(), 0, arena, &tag).status();
}

TEST_CASE("RingDecoder decodes what a socket Launch decodes", "[ring]") {
  Arena a;
  LaunchSpec l = ValidLaunch();
  absl::StatusOr<DecodedLaunch> want = SocketDecode(l, a.arena);
  REQUIRE(want.ok());
  RingDecoder d;
  uint64_t tag = 0;
  std::string bytes = Encode(l, 5, 77);
  absl::StatusOr<const DecodedLaunch*> got =
      d.Decode(bytes.data(), bytes.size(), 5, a.arena, &tag);
  REQUIRE(got.ok());
  CHECK(tag == 77);
  CHECK((*got)->key.name == "demo.scale");
  CHECK((*got)->frame.args.size() == 1);
  CHECK((*got)->frame.rets[0].data == want->frame.rets[0].data);
  CHECK((*got)->frame.rets[0].dims == want->frame.rets[0].dims);
  CHECK((*got)->frame.attrs.size() == 1);
  CHECK((*got)->frame.attrs[0].second.bytes ==
        want->frame.attrs[0].second.bytes);
  CHECK((*got)->frame.run_id == 9);
  // Unchanged attributes are reused; changed ones are decoded again.
  l.mutable_attrs(0)->set_data(std::string("\0\0\x80\x40", 4));
  bytes = Encode(l, 6, 78);
  got = d.Decode(bytes.data(), bytes.size(), 6, a.arena, &tag);
  REQUIRE(got.ok());
  CHECK((*got)->frame.attrs[0].second.bytes == std::string("\0\0\x80\x40", 4));
}

LaunchSpec WithFactor(float factor) {
  LaunchSpec l = ValidLaunch();
  l.mutable_attrs(0)->set_data(&factor, 4);
  return l;
}

float FactorOf(const DecodedLaunch& d) {
  float f;
  REQUIRE(d.frame.attrs.size() == 1);
  REQUIRE(d.frame.attrs[0].second.bytes.size() == 4);
  memcpy(&f, d.frame.attrs[0].second.bytes.data(), 4);
  return f;
}

TEST_CASE("RingDecoder keeps alternating attribute blocks", "[ring]") {
  Arena a;
  RingDecoder d;
  uint64_t tag;
  // Two call sites alternating: each keeps its attrs_generation, and its
  // decoded list stays the same objects (what the call frame cache keeps
  // pointers into).
  std::string two = Encode(WithFactor(2)), three = Encode(WithFactor(3));
  absl::StatusOr<const DecodedLaunch*> r =
      d.Decode(two.data(), two.size(), 0, a.arena, &tag);
  REQUIRE(r.ok());
  const uint64_t gen_two = (*r)->frame.attrs_generation;
  const void* name_two = (*r)->frame.attrs[0].first.data();
  r = d.Decode(three.data(), three.size(), 0, a.arena, &tag);
  REQUIRE(r.ok());
  const uint64_t gen_three = (*r)->frame.attrs_generation;
  CHECK(gen_three != gen_two);
  CHECK(gen_two != 0);
  for (int i = 0; i < 4; ++i) {
    r = d.Decode(two.data(), two.size(), 0, a.arena, &tag);
    REQUIRE(r.ok());
    CHECK((*r)->frame.attrs_generation == gen_two);
    CHECK((*r)->frame.attrs[0].first.data() == name_two);
    CHECK(FactorOf(**r) == 2.0f);
    r = d.Decode(three.data(), three.size(), 0, a.arena, &tag);
    REQUIRE(r.ok());
    CHECK((*r)->frame.attrs_generation == gen_three);
    CHECK(FactorOf(**r) == 3.0f);
  }
  // Many more blocks than it keeps: every decoding is right, and a block
  // decoded again after its eviction gets a generation never seen before.
  std::set<uint64_t> seen = {gen_two, gen_three};
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 40; ++i) {
      std::string bytes = Encode(WithFactor(float(100 + i)));
      r = d.Decode(bytes.data(), bytes.size(), 0, a.arena, &tag);
      REQUIRE(r.ok());
      CHECK(FactorOf(**r) == float(100 + i));
      CHECK(seen.insert((*r)->frame.attrs_generation).second);
    }
  }
  // A failed decoding between two of the same block changes nothing.
  r = d.Decode(two.data(), two.size(), 0, a.arena, &tag);
  REQUIRE(r.ok());
  const uint64_t gen_again = (*r)->frame.attrs_generation;
  LaunchSpec odd = ValidLaunch();
  odd.mutable_attrs(0)->set_data("abc", 3);  // 3 bytes for an F32
  std::string wrong = Encode(odd);
  CHECK_FALSE(d.Decode(wrong.data(), wrong.size(), 0, a.arena, &tag).ok());
  r = d.Decode(two.data(), two.size(), 0, a.arena, &tag);
  REQUIRE(r.ok());
  CHECK((*r)->frame.attrs_generation == gen_again);
  CHECK(FactorOf(**r) == 2.0f);
}

TEST_CASE("RingDecoder: a block rewritten between two launches", "[ring]") {
  Arena a;
  RingDecoder d;
  uint64_t tag;
  // The same slot bytes, the factor rewritten in place (same length): the
  // decoder compares bytes, never where or how long they are.
  std::string slot = Encode(WithFactor(2));
  std::string three = Encode(WithFactor(3));
  REQUIRE(slot.size() == three.size());
  absl::StatusOr<const DecodedLaunch*> r =
      d.Decode(slot.data(), slot.size(), 0, a.arena, &tag);
  REQUIRE(r.ok());
  CHECK(FactorOf(**r) == 2.0f);
  memcpy(slot.data(), three.data(), slot.size());
  r = d.Decode(slot.data(), slot.size(), 0, a.arena, &tag);
  REQUIRE(r.ok());
  CHECK(FactorOf(**r) == 3.0f);
}

TEST_CASE("RingDecoder refuses each bad field as a socket Launch does",
          "[ring]") {
  Arena a;
  std::vector<std::pair<const char*, std::function<void(LaunchSpec*)>>> bad = {
      {"target name", [](LaunchSpec* l) { l->set_target_name("bad name!"); }},
      {"platform", [](LaunchSpec* l) { l->set_platform("tpu"); }},
      {"dtype", [](LaunchSpec* l) { l->mutable_args(0)->set_dtype(999); }},
      {"no width",
       [](LaunchSpec* l) {
         l->mutable_args(0)->set_dtype(XLA_FFI_DataType_TOKEN);
       }},
      {"rank",
       [](LaunchSpec* l) {
         for (int i = 0; i < 70; ++i) l->mutable_args(0)->add_dims(1);
       }},
      {"negative dim",
       [](LaunchSpec* l) { l->mutable_rets(0)->set_dims(1, -3); }},
      {"dims overflow",
       [](LaunchSpec* l) {
         l->mutable_args(0)->set_dims(0, int64_t{1} << 62);
         l->mutable_args(0)->set_dims(1, int64_t{1} << 62);
       }},
      {"size mismatch",
       [](LaunchSpec* l) { l->mutable_args(0)->set_size(20); }},
      {"past the arena",
       [](LaunchSpec* l) { l->mutable_rets(0)->set_offset(4090); }},
      {"offset overflow",
       [](LaunchSpec* l) { l->mutable_args(0)->set_offset(~uint64_t{0} - 3); }},
      {"scalar size",
       [](LaunchSpec* l) { l->mutable_attrs(0)->set_data("abc"); }},
      {"attr kind",
       [](LaunchSpec* l) {
         l->mutable_attrs(0)->set_kind(static_cast<v1::AttrKind>(9));
       }},
      {"attr order",
       [](LaunchSpec* l) {
         v1::Attribute* b = l->add_attrs();
         *b = l->attrs(0);
       }},
      {"device ordinal", [](LaunchSpec* l) { l->set_device_ordinal(-1); }},
  };
  for (const auto& [what, mutate] : bad) {
    INFO(what);
    LaunchSpec l = ValidLaunch();
    mutate(&l);
    absl::StatusOr<DecodedLaunch> want = SocketDecode(l, a.arena);
    REQUIRE(!want.ok());
    absl::Status got = RingStatus(l, a.arena);
    CHECK(got.code() == want.status().code());
    CHECK(got.message() == want.status().message());
  }
}

// --- CUDA descriptors ------------------------------------------------------

const std::string kUuid = std::string("0123456789abcdef", 16);
constexpr uint64_t kBase = 0x7f0000000000ull;
constexpr uint64_t kAlloc = 4096;

LaunchSpec ValidCudaLaunch() {
  LaunchSpec l = ValidLaunch();
  l.set_platform("cuda");
  l.set_device_uuid(kUuid);
  l.set_doorbell_seq(12);
  for (auto* b : {l.mutable_args(0), l.mutable_rets(0)}) {
    b->mutable_cuda()->set_device_uuid(kUuid);
    b->mutable_cuda()->set_base(kBase);
    b->mutable_cuda()->set_size(kAlloc);
    b->mutable_cuda()->set_generation(5);
  }
  BufferSpec* empty = l.add_args();  // size 0: no ref, null for the handler
  empty->set_dtype(XLA_FFI_DataType_F32);
  empty->add_dims(0);
  return l;
}

// A fake of CudaExecutor's resolver: one allocation of kAlloc bytes at
// kBase (generation 5) on kUuid; anything else is NOT_FOUND, a region past
// it OUT_OF_RANGE (the messages CudaMappingCache gives are its own).
struct FakeGpu {
  char memory[kAlloc];
  std::vector<std::string> seen;
  CudaBufferResolver resolver() {
    return [this](const CudaRefView& ref, uint64_t offset, uint64_t size,
                  const std::string& what) -> absl::StatusOr<void*> {
      seen.push_back(what);
      if (ref.device_uuid != kUuid || ref.base != kBase || ref.size != kAlloc ||
          ref.generation != 5) {
        return absl::NotFoundError(what + ": allocation not shared");
      }
      uint64_t end;
      if (__builtin_add_overflow(offset, size, &end) || end > kAlloc) {
        return absl::OutOfRangeError(absl::StrCat(what, ": [", offset, ", +",
                                                  size, ") is outside the ",
                                                  kAlloc, "-byte allocation"));
      }
      return memory + offset;
    };
  }
};

absl::Status CudaRingStatus(const LaunchSpec& l, const ShmArena& arena,
                            FakeGpu* gpu, uint32_t flags = 0) {
  RingDecoder d;
  uint64_t tag;
  std::string bytes = Encode(l);
  if (flags != 0) {
    ring::SubmitHeader h;
    memcpy(&h, bytes.data(), sizeof(h));
    h.flags = flags;
    memcpy(bytes.data(), &h, sizeof(h));
  }
  const CudaBufferResolver r = gpu->resolver();
  return d.Decode(bytes.data(), bytes.size(), 0, arena, &tag, &r).status();
}

TEST_CASE("RingDecoder: a CUDA descriptor decodes what a socket Launch decodes",
          "[ring][cuda]") {
  Arena a;
  FakeGpu gpu;
  LaunchSpec l = ValidCudaLaunch();
  const CudaBufferResolver r = gpu.resolver();
  absl::StatusOr<DecodedLaunch> want = SocketDecode(l, a.arena, &r);
  REQUIRE(want.ok());
  RingDecoder d;
  uint64_t tag = 0;
  std::string bytes = Encode(l, 5, 77);
  ring::SubmitHeader h;
  memcpy(&h, bytes.data(), sizeof(h));
  h.flags = ring::kSubmitAsync;
  memcpy(bytes.data(), &h, sizeof(h));
  absl::StatusOr<RingLaunchHeader> header =
      d.Header(bytes.data(), bytes.size(), 5, &tag);
  REQUIRE(header.ok());
  CHECK(tag == 77);
  CHECK(header->platform == Platform::kCuda);
  CHECK(header->target == "demo.scale");
  CHECK(header->device_uuid == kUuid);
  CHECK(header->doorbell_seq == 12);
  CHECK(header->flags == ring::kSubmitAsync);
  absl::StatusOr<DecodedLaunch*> got =
      d.Decode(bytes.data(), bytes.size(), 5, a.arena, &tag, &r);
  REQUIRE(got.ok());
  CHECK((*got)->key.platform == Platform::kCuda);
  REQUIRE((*got)->frame.args.size() == 2);
  CHECK((*got)->frame.args[0].data == gpu.memory);
  CHECK((*got)->frame.rets[0].data == gpu.memory + 64);
  CHECK((*got)->frame.rets[0].data == want->frame.rets[0].data);
  CHECK((*got)->frame.args[1].data == nullptr);
  CHECK((*got)->frame.args[1].dims == std::vector<int64_t>{0});
  CHECK((*got)->frame.rets[0].dims == want->frame.rets[0].dims);
  CHECK((*got)->frame.attrs.size() == 1);
  CHECK((*got)->frame.run_id == 9);
  // A CPU descriptor still decodes on the same decoder.
  std::string cpu = Encode(ValidLaunch(), 6, 78);
  CHECK(d.Decode(cpu.data(), cpu.size(), 6, a.arena, &tag).ok());
}

TEST_CASE("RingDecoder refuses each bad CUDA field as a socket Launch does",
          "[ring][cuda]") {
  Arena a;
  std::vector<std::pair<const char*, std::function<void(LaunchSpec*)>>> bad = {
      {"offset past the allocation",
       [](LaunchSpec* l) { l->mutable_rets(0)->set_offset(kAlloc - 8); }},
      {"offset overflow",
       [](LaunchSpec* l) { l->mutable_args(0)->set_offset(~uint64_t{0} - 3); }},
      {"unknown allocation",
       [](LaunchSpec* l) {
         l->mutable_args(0)->mutable_cuda()->set_generation(6);
       }},
      {"size mismatch",
       [](LaunchSpec* l) { l->mutable_args(0)->set_size(20); }},
      {"negative dim",
       [](LaunchSpec* l) { l->mutable_rets(0)->set_dims(1, -3); }},
      {"dtype", [](LaunchSpec* l) { l->mutable_args(0)->set_dtype(999); }},
      {"target name", [](LaunchSpec* l) { l->set_target_name("bad name!"); }},
      {"platform", [](LaunchSpec* l) { l->set_platform("tpu"); }},
  };
  for (const auto& [what, mutate] : bad) {
    INFO(what);
    LaunchSpec l = ValidCudaLaunch();
    mutate(&l);
    FakeGpu g1, g2;
    const CudaBufferResolver r = g1.resolver();
    absl::Status want = SocketDecode(l, a.arena, &r).status();
    REQUIRE_FALSE(want.ok());
    absl::Status got = CudaRingStatus(l, a.arena, &g2);
    CHECK(got.code() == want.code());
    CHECK(got.message() == want.message());
  }
}

TEST_CASE("RingDecoder: CUDA header fields and what only the ring checks",
          "[ring][cuda]") {
  Arena a;
  FakeGpu gpu;
  // No CUDA on this kregd (no resolver).
  LaunchSpec l = ValidCudaLaunch();
  CHECK(RingStatus(l, a.arena) ==
        absl::UnimplementedError("launching \"demo.scale\" for platform cuda: "
                                 "this kregd serves no CUDA device"));
  // Not ordered by the doorbell.
  l.set_doorbell_seq(0);
  CHECK(CudaRingStatus(l, a.arena, &gpu) ==
        absl::InvalidArgumentError(
            "launching \"demo.scale\": a CUDA launch descriptor needs a "
            "doorbell sequence number > 0 (the launch ring orders CUDA "
            "launches by the doorbell only; interprocess events travel on "
            "the session socket)"));
  // A CPU descriptor with CUDA fields.
  LaunchSpec cpu = ValidLaunch();
  cpu.set_doorbell_seq(3);
  CHECK(RingStatus(cpu, a.arena) ==
        absl::InvalidArgumentError(
            "launching \"demo.scale\": a CPU launch descriptor carries CUDA "
            "fields (doorbell sequence number 3)"));
  cpu.set_doorbell_seq(0);
  cpu.set_device_uuid(kUuid);
  CHECK(RingStatus(cpu, a.arena) ==
        absl::InvalidArgumentError(
            "launching \"demo.scale\": a CPU launch descriptor carries CUDA "
            "fields (doorbell sequence number 0, a device UUID)"));
  // Unknown flags.
  CHECK(CudaRingStatus(ValidCudaLaunch(), a.arena, &gpu, 6) ==
        absl::InvalidArgumentError(
            "launch descriptor has unknown flags 0x6 (launch ring version 2 "
            "knows flags 0x3; client and kregd disagree on the ring "
            "layout?)"));
  // The trace flag (ring::kSubmitTrace) is known.
  CHECK(CudaRingStatus(ValidCudaLaunch(), a.arena, &gpu, ring::kSubmitTrace)
            .ok());
  // A 0-byte buffer that names an allocation.
  l = ValidCudaLaunch();
  *l.mutable_args(1)->mutable_cuda() = l.args(0).cuda();
  CHECK(CudaRingStatus(l, a.arena, &gpu) ==
        absl::InvalidArgumentError(
            "arg 1: a 0-byte buffer names allocation 0x7f0000000000 (+4096 "
            "bytes, generation 5) at offset 0; an empty buffer of a CUDA "
            "descriptor has an all-zero CudaRef and offset"));
  // A buffer of bytes without an allocation.
  l = ValidCudaLaunch();
  l.mutable_args(0)->clear_cuda();
  CHECK(CudaRingStatus(l, a.arena, &gpu) ==
        absl::InvalidArgumentError(
            "arg 0: a CUDA launch's buffer of 24 bytes names no CUDA "
            "allocation"));
  // The device in the descriptor is what every ref is resolved on: a
  // wrong one is the resolver's (CudaExecutor refuses it: not the
  // session's device, or not one of kregd's).
  l = ValidCudaLaunch();
  l.set_device_uuid(std::string(16, 'x'));
  absl::Status s = CudaRingStatus(l, a.arena, &gpu);
  CHECK(s == absl::NotFoundError("arg 0: allocation not shared"));
}

TEST_CASE("RingDecoder: torn and truncated CUDA descriptors", "[ring][cuda]") {
  Arena a;
  FakeGpu gpu;
  const CudaBufferResolver r = gpu.resolver();
  RingDecoder d;
  uint64_t tag = 0;
  std::string bytes = Encode(ValidCudaLaunch(), 3, 11);
  absl::Status s =
      d.Decode(bytes.data(), bytes.size() - 8, 3, a.arena, &tag, &r).status();
  CHECK(s.message().find("torn launch descriptor: its header says") == 0);
  // One buffer more than the bytes hold: its CudaRef is cut.
  ring::SubmitHeader h;
  memcpy(&h, bytes.data(), sizeof(h));
  const size_t header_and_names =
      (sizeof(h) + h.target_len + h.platform_len + 7) / 8 * 8;
  // arg 0 complete (desc, ref, 2 dims), then arg 1's desc only.
  const size_t cut = header_and_names + 24 + 24 + 16 + 24;
  std::string copy = bytes.substr(0, cut);
  h.length = static_cast<uint32_t>(cut);
  h.attrs_len = 0;
  memcpy(copy.data(), &h, sizeof(h));
  s = d.Decode(copy.data(), copy.size(), 3, a.arena, &tag, &r).status();
  CHECK(s.message() ==
        "launch descriptor is truncated: an arg's CUDA allocation needs 24 "
        "bytes, 0 are left");
  // Garbage of every length, as a CUDA descriptor: never a crash, always a
  // message.
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::string junk = bytes;
    for (int k = 0; k < 4; ++k) {
      junk[rng() % junk.size()] = static_cast<char>(rng());
    }
    absl::StatusOr<DecodedLaunch*> got =
        d.Decode(junk.data(), junk.size(), 3, a.arena, &tag, &r);
    if (!got.ok()) {
      CHECK_FALSE(got.status().message().empty());
      continue;
    }
    for (const auto* list : {&(*got)->frame.args, &(*got)->frame.rets}) {
      for (const BufferRef& b : *list) {
        if (b.data == nullptr) continue;
        CHECK(static_cast<char*>(b.data) >= gpu.memory);
        CHECK(static_cast<char*>(b.data) < gpu.memory + kAlloc);
      }
    }
  }
  CHECK(d.Decode(bytes.data(), bytes.size(), 3, a.arena, &tag, &r).ok());
}

TEST_CASE("RingDecoder: torn, short and mis-sequenced descriptors", "[ring]") {
  Arena a;
  RingDecoder d;
  uint64_t tag = 0;
  std::string bytes = Encode(ValidLaunch(), 3, 11);
  // Fewer bytes taken than the header announces (a torn write).
  absl::Status s =
      d.Decode(bytes.data(), bytes.size() - 8, 3, a.arena, &tag).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("torn launch descriptor") == 0);
  CHECK(tag == 11);
  s = d.Decode(bytes.data(), 20, 3, a.arena, &tag).status();
  CHECK(s.message() ==
        "launch descriptor of 20 bytes is shorter than its 88-byte header");
  CHECK(tag == 0);
  s = d.Decode(bytes.data(), bytes.size(), 4, a.arena, &tag).status();
  CHECK(s.message() ==
        "launch descriptor at ring position 4 carries sequence number 3");
  // Lengths inside the descriptor that point past its end.
  std::string copy = bytes;
  ring::SubmitHeader h;
  memcpy(&h, copy.data(), sizeof(h));
  h.attrs_len += 100;
  memcpy(copy.data(), &h, sizeof(h));
  s = d.Decode(copy.data(), copy.size(), 3, a.arena, &tag).status();
  CHECK(s.message().find("launch descriptor is truncated: attributes") == 0);
  memcpy(&h, bytes.data(), sizeof(h));
  h.num_rets = 3;
  copy = bytes;
  memcpy(copy.data(), &h, sizeof(h));
  s = d.Decode(copy.data(), copy.size(), 3, a.arena, &tag).status();
  CHECK(s.message().find("launch descriptor is truncated") == 0);
  memcpy(&h, bytes.data(), sizeof(h));
  h.num_args = 5000;
  copy = bytes;
  memcpy(copy.data(), &h, sizeof(h));
  s = d.Decode(copy.data(), copy.size(), 3, a.arena, &tag).status();
  CHECK(s.message() ==
        "launch has 5000 args and 1 rets; the maximum is 4096 each");
  // Trailing bytes.
  memcpy(&h, bytes.data(), sizeof(h));
  h.attrs_len -= 1;
  copy = bytes;
  memcpy(copy.data(), &h, sizeof(h));
  s = d.Decode(copy.data(), copy.size(), 3, a.arena, &tag).status();
  CHECK(s.message() == "launch descriptor has 1 bytes after its attributes");
  // Attribute bytes that are not a Launch.
  copy = bytes;
  memset(copy.data() + copy.size() - h.attrs_len - 1, 0xff, h.attrs_len + 1);
  s = d.Decode(copy.data(), copy.size(), 3, a.arena, &tag).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  // And the decoder still works afterwards.
  CHECK(d.Decode(bytes.data(), bytes.size(), 3, a.arena, &tag).ok());
}

TEST_CASE("RingDecoder survives garbage and bit flips", "[ring]") {
  Arena a;
  RingDecoder d;
  uint64_t tag;
  std::mt19937_64 rng(1234);
  const std::string valid = Encode(ValidLaunch(), 0, 1);
  int ok = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string bytes;
    if (i % 2 == 0) {
      bytes.resize(rng() % 600);
      for (char& c : bytes) c = static_cast<char>(rng());
      if (bytes.size() >= 8) {  // often a plausible header
        uint32_t len = static_cast<uint32_t>(bytes.size());
        memcpy(bytes.data(), &len, 4);
        memset(bytes.data() + 4, 0, 4);
      }
    } else {
      bytes = valid;
      for (int f = 0; f < 1 + i % 4; ++f) {
        bytes[rng() % bytes.size()] ^= static_cast<char>(1u << (rng() % 8));
      }
    }
    absl::StatusOr<const DecodedLaunch*> r =
        d.Decode(bytes.data(), bytes.size(), 0, a.arena, &tag);
    if (r.ok()) {
      ++ok;
      for (const auto* list : {&(*r)->frame.args, &(*r)->frame.rets}) {
        for (const BufferRef& b : *list) {
          char* p = static_cast<char*>(b.data);
          bool inside = b.data != nullptr &&
                        p >= static_cast<char*>(*a.arena.Region(0, 0));
          CHECK(inside);
        }
      }
    }
  }
  CHECK(ok < 20000);
}

// ---- accounting in max_buffered_bytes (wire::ByteBudget) -----------------

// What one cached block of WithFactor costs.
uint64_t OneBlock(const ShmArena& arena) {
  wire::ByteBudget budget(1 << 20);
  RingDecoder d(&budget);
  uint64_t tag;
  std::string bytes = Encode(WithFactor(1));
  REQUIRE(d.Decode(bytes.data(), bytes.size(), 0, arena, &tag).ok());
  return budget.used();
}

TEST_CASE("RingDecoder charges cached blocks and gives them back",
          "[ring][budget]") {
  Arena a;
  const uint64_t one = OneBlock(a.arena);
  CHECK(one > 0);
  wire::ByteBudget budget(1 << 20);
  {
    RingDecoder d(&budget);
    uint64_t tag;
    std::string two = Encode(WithFactor(2)), three = Encode(WithFactor(3));
    REQUIRE(d.Decode(two.data(), two.size(), 0, a.arena, &tag).ok());
    CHECK(budget.used() == one);
    REQUIRE(d.Decode(two.data(), two.size(), 0, a.arena, &tag).ok());
    CHECK(budget.used() == one);  // a cached block costs nothing more
    REQUIRE(d.Decode(three.data(), three.size(), 0, a.arena, &tag).ok());
    CHECK(budget.used() == 2 * one);
    CHECK(d.charged_bytes() == 2 * one);
    // Evicted blocks give their bytes back.
    for (int i = 0; i < 40; ++i) {
      std::string bytes = Encode(WithFactor(float(100 + i)));
      REQUIRE(d.Decode(bytes.data(), bytes.size(), 0, a.arena, &tag).ok());
    }
    CHECK(budget.used() == 16 * one);
    CHECK(d.charged_bytes() == budget.used());
  }
  CHECK(budget.used() == 0);  // the session ended
}

TEST_CASE("RingDecoder evicts its own blocks before it refuses",
          "[ring][budget]") {
  Arena a;
  const uint64_t one = OneBlock(a.arena);
  wire::ByteBudget budget(2 * one + one / 2);  // room for two blocks
  RingDecoder d(&budget);
  uint64_t tag;
  for (int i = 0; i < 5; ++i) {
    std::string bytes = Encode(WithFactor(float(i)));
    absl::StatusOr<const DecodedLaunch*> r =
        d.Decode(bytes.data(), bytes.size(), 0, a.arena, &tag);
    REQUIRE(r.ok());
    CHECK(FactorOf(**r) == float(i));
    CHECK(budget.used() <= budget.limit());
  }
  CHECK(budget.used() == 2 * one);
  // The block in the frame stays usable.
  std::string last = Encode(WithFactor(4));
  absl::StatusOr<const DecodedLaunch*> r =
      d.Decode(last.data(), last.size(), 0, a.arena, &tag);
  REQUIRE(r.ok());
  CHECK(FactorOf(**r) == 4.0f);
}

TEST_CASE("RingDecoder refuses a block the budget cannot cover",
          "[ring][budget]") {
  Arena a;
  const uint64_t one = OneBlock(a.arena);
  wire::ByteBudget budget(1000 + one - 1);
  REQUIRE(budget.TryTake(1000));  // another session's receive buffer
  RingDecoder d(&budget);
  uint64_t tag;
  std::string bytes = Encode(WithFactor(2));
  absl::StatusOr<const DecodedLaunch*> r =
      d.Decode(bytes.data(), bytes.size(), 0, a.arena, &tag);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kResourceExhausted);
  const std::string msg(r.status().message());
  CHECK(msg.find(absl::StrCat("launch refused: caching its attribute block "
                              "(the launch ring's attribute cache) needs ",
                              one, " bytes")) == 0);
  CHECK(msg.find(absl::StrCat("already hold 1000 of their limit of ",
                              1000 + one - 1, " bytes (max_buffered_bytes)")) !=
        std::string::npos);
  CHECK(budget.used() == 1000);
  CHECK(d.charged_bytes() == 0);
  budget.Give(1000);
  r = d.Decode(bytes.data(), bytes.size(), 0, a.arena, &tag);
  REQUIRE(r.ok());
  CHECK(FactorOf(**r) == 2.0f);
}

// ---- a descriptor in a socket Launch (seq nullopt) -----------------------

TEST_CASE("RingDecoder: what differs for a socket Launch's descriptor",
          "[ring][socket]") {
  Arena a;
  FakeGpu gpu;
  const CudaBufferResolver r = gpu.resolver();
  RingDecoder d;
  uint64_t tag = 0;
  // Its seq and tag are not checked (the request id names the launch).
  std::string bytes = Encode(ValidLaunch(), 9, 77);
  absl::StatusOr<DecodedLaunch*> got =
      d.Decode(bytes.data(), bytes.size(), std::nullopt, a.arena, &tag);
  REQUIRE(got.ok());
  CHECK((*got)->frame.run_id == 9);
  // A CUDA launch ordered by interprocess events: doorbell_seq 0.
  LaunchSpec events = ValidCudaLaunch();
  events.set_doorbell_seq(0);
  bytes = Encode(events);
  absl::StatusOr<RingLaunchHeader> header =
      d.Header(bytes.data(), bytes.size(), std::nullopt, &tag);
  REQUIRE(header.ok());
  CHECK(header->doorbell_seq == 0);
  CHECK(header->device_uuid == kUuid);
  got = d.Decode(bytes.data(), bytes.size(), std::nullopt, a.arena, &tag, &r);
  REQUIRE(got.ok());
  CHECK((*got)->frame.rets[0].data == gpu.memory + 64);
  // A CPU descriptor still carries no CUDA fields.
  LaunchSpec cpu = ValidLaunch();
  cpu.set_doorbell_seq(3);
  bytes = Encode(cpu);
  CHECK(d.Decode(bytes.data(), bytes.size(), std::nullopt, a.arena, &tag)
            .status() ==
        absl::InvalidArgumentError(
            "launching \"demo.scale\": a CPU launch descriptor carries CUDA "
            "fields (doorbell sequence number 3)"));
  // Its length is the Launch's bytes.
  bytes = Encode(ValidLaunch());
  bytes += "junk";
  CHECK(d.Decode(bytes.data(), bytes.size(), std::nullopt, a.arena, &tag)
            .status() ==
        absl::InvalidArgumentError(absl::StrCat(
            "launch descriptor: its header says ", bytes.size() - 4,
            " bytes, the socket Launch carries ", bytes.size())));
}

TEST_CASE("RingDecoder: a socket descriptor larger than a slot",
          "[ring][socket][budget]") {
  Arena a;
  wire::ByteBudget budget(1 << 20);
  RingDecoder d(&budget);
  uint64_t tag;
  LaunchSpec l = ValidLaunch();
  v1::Attribute* big = l.add_attrs();
  big->set_name("text");
  big->set_kind(v1::ATTR_KIND_STRING);
  big->set_data(std::string(ring::kSubmitSlotBytes, 'x'));
  const std::string bytes = Encode(l);
  REQUIRE(bytes.size() > ring::kSubmitSlotBytes);
  // Too large for the ring: a slot's worth was taken, the header disagrees.
  CHECK_THAT(std::string(d.Decode(bytes.data(), ring::kSubmitSlotBytes, 0,
                                  a.arena, &tag)
                             .status()
                             .message()),
             Catch::StartsWith("torn launch descriptor: its header says"));
  // On the socket it decodes; its attributes are not cached (nor charged).
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<DecodedLaunch*> got =
        d.Decode(bytes.data(), bytes.size(), std::nullopt, a.arena, &tag);
    REQUIRE(got.ok());
    REQUIRE((*got)->frame.attrs.size() == 2);
    CHECK((*got)->frame.attrs[1].second.bytes.size() == ring::kSubmitSlotBytes);
    CHECK((*got)->frame.attrs_generation == 0);
    CHECK(budget.used() == 0);
  }
  // A cached block comes back after it.
  const std::string small = Encode(WithFactor(5));
  REQUIRE(
      d.Decode(small.data(), small.size(), std::nullopt, a.arena, &tag).ok());
  REQUIRE(
      d.Decode(bytes.data(), bytes.size(), std::nullopt, a.arena, &tag).ok());
  absl::StatusOr<DecodedLaunch*> again =
      d.Decode(small.data(), small.size(), std::nullopt, a.arena, &tag);
  REQUIRE(again.ok());
  CHECK(FactorOf(**again) == 5.0f);
  CHECK((*again)->frame.attrs_generation != 0);
}

}  // namespace
}  // namespace kreg
