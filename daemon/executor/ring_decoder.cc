#include "daemon/executor/ring_decoder.h"

#include <stddef.h>
#include <string.h>

#include <atomic>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/ring_layout.h"
#include "common/status_macros.h"
#include "daemon/base/platform_table.h"
#include "daemon/base/validate.h"

namespace kreg {
namespace {

// Reads a descriptor front to back, never past its end.
class Cursor {
 public:
  Cursor(const char* data, size_t size) : data_(data), size_(size) {}
  size_t left() const { return size_ - pos_; }
  size_t pos() const { return pos_; }
  // The next `n` bytes, or null when fewer are left.
  const char* Take(size_t n) {
    if (n > left()) return nullptr;
    const char* p = data_ + pos_;
    pos_ += n;
    return p;
  }

 private:
  const char* data_;
  size_t size_;
  size_t pos_ = 0;
};

absl::Status Truncated(const char* what, size_t need, size_t left) {
  return absl::InvalidArgumentError(
      absl::StrCat("launch descriptor is truncated: ", what, " needs ", need,
                   " bytes, ", left, " are left"));
}

// What a decoded attribute list takes (an estimate: its vectors and the
// bytes of its names and values).
uint64_t AttrListBytes(const AttrList& list) {
  uint64_t n = list.capacity() * sizeof(AttrList::value_type);
  for (const auto& [name, attr] : list) {
    n += name.size() + attr.bytes.size() + AttrListBytes(attr.dict);
  }
  return n;
}

}  // namespace

uint64_t RingDecoder::charged_bytes() const {
  uint64_t n = 0;
  for (const AttrEntry& e : attr_entries_) n += e.hold.held();
  return n;
}

void RingDecoder::Evict(size_t i) {
  AttrEntry& e = attr_entries_[i];
  std::string().swap(e.bytes);
  AttrList().swap(e.attrs);
  e.generation = 0;
  e.used = 0;
  e.valid = false;
  e.hold.Set(0);
}

absl::Status RingDecoder::Charge(size_t slot, uint64_t need) {
  while (!attr_entries_[slot].hold.Set(need)) {
    size_t victim = attr_entries_.size();
    for (size_t i = 0; i < attr_entries_.size(); ++i) {
      if (i != slot && static_cast<int>(i) != current_ &&
          attr_entries_[i].valid &&
          (victim == attr_entries_.size() ||
           attr_entries_[i].used < attr_entries_[victim].used)) {
        victim = i;
      }
    }
    if (victim == attr_entries_.size()) {
      return absl::ResourceExhaustedError(wire::OverBudgetText(
          *budget_, need,
          "launch refused: caching its attribute block (the launch "
          "ring's attribute cache)"));
    }
    Evict(victim);
  }
  return absl::OkStatus();
}

void RingDecoder::UseEntry(size_t i) {
  if (current_ >= 0) {
    attr_entries_[current_].attrs = std::move(launch_.frame.attrs);
  }
  launch_.frame.attrs = std::move(attr_entries_[i].attrs);
  launch_.frame.attrs_generation = attr_entries_[i].generation;
  current_ = static_cast<int>(i);
}

absl::Status RingDecoder::DecodeAttrBytes(const char* data, size_t size) {
  ++clock_;
  auto same = [&](const AttrEntry& e) {
    return e.valid && e.bytes.size() == size &&
           (size == 0 || memcmp(e.bytes.data(), data, size) == 0);
  };
  if (current_ >= 0 && same(attr_entries_[current_])) {
    attr_entries_[current_].used = clock_;
    return absl::OkStatus();
  }
  for (size_t i = 0; i < attr_entries_.size(); ++i) {
    if (static_cast<int>(i) != current_ && same(attr_entries_[i])) {
      attr_entries_[i].used = clock_;
      UseEntry(i);
      return absl::OkStatus();
    }
  }
  attr_message_.Clear();
  if (!attr_message_.ParseFromArray(data, static_cast<int>(size))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "launch descriptor: its ", size,
        " attribute bytes do not parse as kreg.v1.AttributeBlock"));
  }
  KREG_ASSIGN_OR_RETURN(AttrList attrs, DecodeAttrs(attr_message_.attrs()));
  if (size > ring::kSubmitSlotBytes) {  // a socket Launch's: not kept
    if (current_ >= 0) {
      attr_entries_[current_].attrs = std::move(launch_.frame.attrs);
    }
    current_ = -1;
    launch_.frame.attrs = std::move(attrs);
    launch_.frame.attrs_generation = 0;
    return absl::OkStatus();
  }
  // An evicted entry, else a new one, else the least recently used block
  // other than the one in the frame (evicted used are 0: the least).
  size_t slot = attr_entries_.size();
  for (size_t i = 0; i < attr_entries_.size(); ++i) {
    if (!attr_entries_[i].valid && static_cast<int>(i) != current_) slot = i;
  }
  if (slot == attr_entries_.size() && slot < kAttrEntries) {
    attr_entries_.emplace_back().hold = wire::BudgetHold(budget_);
  } else if (slot == attr_entries_.size()) {
    slot = current_ == 0 ? 1 : 0;
    for (size_t i = 0; i < attr_entries_.size(); ++i) {
      if (static_cast<int>(i) != current_ &&
          attr_entries_[i].used < attr_entries_[slot].used) {
        slot = i;
      }
    }
  }
  Evict(slot);
  KREG_RETURN_IF_ERROR(Charge(slot, size + AttrListBytes(attrs)));
  AttrEntry& e = attr_entries_[slot];
  e.valid = true;
  e.bytes.assign(data, size);
  e.attrs = std::move(attrs);
  // Unique across decoders and never reused: a cache keyed by it can never
  // confuse two blocks, an evicted one or another session's.
  static std::atomic<uint64_t> generations{0};
  e.generation = generations.fetch_add(1) + 1;
  e.used = clock_;
  UseEntry(slot);
  return absl::OkStatus();
}

absl::Status RingDecoder::CheckHeader(const char* data, size_t size,
                                      std::optional<uint32_t> seq,
                                      uint64_t* tag, ring::SubmitHeader* hp,
                                      RingLaunchHeader* out,
                                      size_t* pos) const {
  *tag = 0;
  ring::SubmitHeader& h = *hp;
  if (size < sizeof(h)) {
    return absl::InvalidArgumentError(
        absl::StrCat("launch descriptor of ", size,
                     " bytes is shorter than its ", sizeof(h), "-byte header"));
  }
  memcpy(&h, data, sizeof(h));
  *tag = h.tag;
  if (h.length != size && !seq.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("launch descriptor: its header says ", h.length,
                     " bytes, the socket Launch carries ", size));
  }
  if (h.length != size) {
    return absl::InvalidArgumentError(
        absl::StrCat("torn launch descriptor: its header says ", h.length,
                     " bytes, ", size, " were taken (a descriptor is ",
                     sizeof(h), "-", ring::kSubmitSlotBytes, " bytes)"));
  }
  if (seq.has_value() && h.seq != *seq) {
    return absl::InvalidArgumentError(
        absl::StrCat("launch descriptor at ring position ", *seq,
                     " carries sequence number ", h.seq));
  }
  if ((h.flags & ~ring::kSubmitFlags) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "launch descriptor has unknown flags 0x", absl::Hex(h.flags),
        " (launch ring version ", ring::kVersion, " knows flags 0x",
        absl::Hex(ring::kSubmitFlags),
        "; client and kregd disagree on the ring layout?)"));
  }
  Cursor in(data, size);
  in.Take(sizeof(h));
  const char* name = in.Take(h.target_len);
  if (name == nullptr) return Truncated("target name", h.target_len, in.left());
  const char* platform_text = in.Take(h.platform_len);
  if (platform_text == nullptr) {
    return Truncated("platform", h.platform_len, in.left());
  }
  const absl::string_view target(name, h.target_len);
  KREG_RETURN_IF_ERROR(ValidateTargetName(target));
  KREG_ASSIGN_OR_RETURN(Platform platform, ParsePlatform(absl::string_view(
                                               platform_text, h.platform_len)));
  static constexpr uint8_t kNoUuid[sizeof(h.device_uuid)] = {};
  const bool has_uuid = memcmp(h.device_uuid, kNoUuid, sizeof(kNoUuid)) != 0;
  const std::string upper = absl::AsciiStrToUpper(PlatformName(platform));
  switch (TraitsOf(platform).memory) {
    case PlatformMemory::kHost:
      if (h.doorbell_seq != 0 || has_uuid) {
        return absl::InvalidArgumentError(absl::StrCat(
            "launching \"", target, "\": a ", upper,
            " launch descriptor carries CUDA fields (doorbell sequence "
            "number ",
            h.doorbell_seq, has_uuid ? ", a device UUID)" : ")"));
      }
      break;
    case PlatformMemory::kCuda:
      if (h.doorbell_seq == 0 && seq.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "launching \"", target, "\": a ", upper,
            " launch descriptor needs a doorbell sequence number > 0 (the "
            "launch ring orders CUDA launches by the doorbell only; "
            "interprocess events travel on the session socket)"));
      }
      break;
  }
  out->platform = platform;
  out->target = target;
  if (TraitsOf(platform).memory == PlatformMemory::kCuda) {
    out->device_uuid =
        absl::string_view(data + offsetof(ring::SubmitHeader, device_uuid),
                          sizeof(h.device_uuid));
  }
  out->doorbell_seq = h.doorbell_seq;
  out->flags = h.flags;
  out->generation = h.generation;
  out->state = h.state;
  *pos = in.pos();
  return absl::OkStatus();
}

absl::StatusOr<RingLaunchHeader> RingDecoder::Header(
    const char* data, size_t size, std::optional<uint32_t> seq,
    uint64_t* tag) const {
  ring::SubmitHeader h;
  RingLaunchHeader out;
  size_t pos;
  KREG_RETURN_IF_ERROR(CheckHeader(data, size, seq, tag, &h, &out, &pos));
  return out;
}

absl::StatusOr<DecodedLaunch*> RingDecoder::Decode(
    const char* data, size_t size, std::optional<uint32_t> seq,
    const ShmArena& arena, uint64_t* tag, const CudaBufferResolver* cuda,
    bool shapes_only) {
  ring::SubmitHeader h;
  RingLaunchHeader head;
  size_t header_end;
  KREG_RETURN_IF_ERROR(
      CheckHeader(data, size, seq, tag, &h, &head, &header_end));
  const Platform platform = head.platform;
  const bool on_cuda = TraitsOf(platform).memory == PlatformMemory::kCuda;
  if (on_cuda && cuda == nullptr && !shapes_only) {
    return absl::UnimplementedError(absl::StrCat(
        "launching \"", head.target, "\" for platform ", PlatformName(platform),
        ": this kregd serves no CUDA device"));
  }
  if (on_cuda)
    device_uuid_.assign(head.device_uuid.data(), head.device_uuid.size());
  Cursor in(data, size);
  in.Take(header_end);
  if (launch_.key.name != head.target || launch_.key.platform != platform) {
    launch_.key = TargetKey{std::string(head.target), platform};
  }
  launch_.generation = head.generation;
  launch_.state = head.state;
  launch_.frame.platform = platform;
  if (size_t pad = (8 - in.pos() % 8) % 8; in.Take(pad) == nullptr) {
    return Truncated("padding", pad, in.left());
  }
  if (h.num_args > static_cast<uint32_t>(kMaxLaunchBuffers) ||
      h.num_rets > static_cast<uint32_t>(kMaxLaunchBuffers)) {
    return absl::InvalidArgumentError(
        absl::StrCat("launch has ", h.num_args, " args and ", h.num_rets,
                     " rets; the maximum is ", kMaxLaunchBuffers, " each"));
  }
  launch_.frame.args.resize(h.num_args);
  launch_.frame.rets.resize(h.num_rets);
  int64_t dims[kMaxLaunchRank];
  for (uint32_t i = 0; i < h.num_args + h.num_rets; ++i) {
    const bool is_arg = i < h.num_args;
    const uint32_t index = is_arg ? i : i - h.num_args;
    const char* d = in.Take(sizeof(ring::BufferDesc));
    if (d == nullptr) {
      return Truncated(is_arg ? "an arg" : "a ret", sizeof(ring::BufferDesc),
                       in.left());
    }
    ring::BufferDesc b;
    memcpy(&b, d, sizeof(b));
    ring::CudaRef ref{};
    if (on_cuda) {
      const char* r = in.Take(sizeof(ref));
      if (r == nullptr) {
        return Truncated(
            is_arg ? "an arg's CUDA allocation" : "a ret's CUDA allocation",
            sizeof(ref), in.left());
      }
      memcpy(&ref, r, sizeof(ref));
    }
    const std::string what = absl::StrCat(is_arg ? "arg " : "ret ", index);
    BufferRef* out =
        is_arg ? &launch_.frame.args[index] : &launch_.frame.rets[index];
    const int64_t* dims_at = nullptr;
    if (b.rank <= static_cast<uint32_t>(kMaxLaunchRank)) {
      const char* raw = in.Take(size_t{b.rank} * sizeof(int64_t));
      if (raw == nullptr) {
        return Truncated("dims", size_t{b.rank} * sizeof(int64_t), in.left());
      }
      memcpy(dims, raw, size_t{b.rank} * sizeof(int64_t));
      dims_at = dims;
    }
    // A rank above the maximum fails in there before its dims are read.
    absl::Status s;
    if (shapes_only) {
      const bool no_ref = ref.base == 0 && ref.size == 0 && ref.generation == 0;
      if (b.offset != 0 || !no_ref) {
        return absl::InvalidArgumentError(absl::StrCat(
            what,
            ": a stage call's buffer carries its shape only, but this "
            "one names offset ",
            b.offset, " and allocation 0x", absl::Hex(ref.base),
            " (a prepare or initialize stage gets no buffer data)"));
      }
      s = DecodeBufferShape(b.dtype, dims_at, b.rank, b.size, what, out);
    } else if (on_cuda) {
      const bool no_ref = ref.base == 0 && ref.size == 0 && ref.generation == 0;
      if (b.size == 0 && (!no_ref || b.offset != 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": a 0-byte buffer names allocation 0x", absl::Hex(ref.base),
            " (+", ref.size, " bytes, generation ", ref.generation,
            ") at offset ", b.offset,
            "; an empty buffer of a CUDA descriptor has an all-zero CudaRef "
            "and offset"));
      }
      const CudaRefView view{device_uuid_, ref.base, ref.size, ref.generation};
      s = DecodeCudaBufferFields(b.dtype, dims_at, b.rank,
                                 no_ref ? nullptr : &view, b.offset, b.size,
                                 *cuda, what, out);
    } else {
      s = DecodeArenaBuffer(b.dtype, dims_at, b.rank, b.offset, b.size, arena,
                            what, out);
    }
    if (!s.ok()) return s;
  }
  const char* attrs = in.Take(h.attrs_len);
  if (attrs == nullptr) return Truncated("attributes", h.attrs_len, in.left());
  if (in.left() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "launch descriptor has ", in.left(), " bytes after its attributes"));
  }
  KREG_RETURN_IF_ERROR(DecodeAttrBytes(attrs, h.attrs_len));
  if (h.device_ordinal < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device ordinal ", h.device_ordinal, " is negative"));
  }
  launch_.frame.device_ordinal = h.device_ordinal;
  launch_.frame.run_id = h.run_id;
  return &launch_;
}

}  // namespace kreg
