#include "client/shim/ring_client.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/session/ring_layout.h"

namespace kreg {
namespace shim {
namespace {

void AppendVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// `launch.attrs()` as the protobuf encoding of a Launch holding only them
// (repeated field 5, length-delimited).
void EncodeAttrBytes(const v1::Launch& launch, std::string* out) {
  out->clear();
  for (const v1::Attribute& a : launch.attrs()) {
    out->push_back(static_cast<char>((5 << 3) | 2));
    size_t n = a.ByteSizeLong();
    AppendVarint(n, out);
    size_t at = out->size();
    out->resize(at + n);
    a.SerializeWithCachedSizesToArray(
        reinterpret_cast<uint8_t*>(out->data() + at));
  }
}

}  // namespace

ClientStatus ClientRing::Create(std::unique_ptr<ClientRing>* out) {
  int fd = ::memfd_create("kreg-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    return ClientStatus::Error(kInternal,
                               std::string("memfd_create: ") + strerror(errno));
  }
  if (::ftruncate(fd, static_cast<off_t>(ring::kRegionBytes)) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) !=
          0) {
    int err = errno;
    ::close(fd);
    return ClientStatus::Error(
        kResourceExhausted,
        std::string("cannot create the launch ring: ") + strerror(err));
  }
  void* base = ::mmap(nullptr, ring::kRegionBytes, PROT_READ | PROT_WRITE,
                      MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    int err = errno;
    ::close(fd);
    return ClientStatus::Error(
        kResourceExhausted,
        std::string("cannot map the launch ring: ") + strerror(err));
  }
  ring::Control* c = ring::ControlOf(static_cast<char*>(base));
  c->magic = ring::kMagic;
  c->version = ring::kVersion;
  out->reset(new ClientRing(fd, static_cast<char*>(base)));
  return ClientStatus::Ok();
}

ClientRing::~ClientRing() {
  ::munmap(base_, ring::kRegionBytes);
  CloseFd();
}

void ClientRing::CloseFd() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool ClientRing::Submit(const v1::Launch& launch, uint64_t tag) {
  EncodeAttrBytes(launch, &attrs_);
  const std::string& target = launch.target_name();
  const std::string& platform = launch.platform();
  size_t need = sizeof(ring::SubmitHeader) + target.size() + platform.size();
  need = (need + 7) / 8 * 8;
  for (const auto* list : {&launch.args(), &launch.rets()}) {
    for (const v1::Buffer& b : *list) {
      need += sizeof(ring::BufferDesc) + b.dims_size() * sizeof(int64_t);
    }
  }
  need += attrs_.size();
  if (need > ring::kSubmitSlotBytes) return false;

  char* slot = ring::SubmitSlot(base_, sq_tail_);
  ring::SubmitHeader h{};
  h.length = static_cast<uint32_t>(need);
  h.seq = sq_tail_;
  h.tag = tag;
  tag_ = tag;
  h.run_id = launch.run_id();
  h.device_ordinal = launch.device_ordinal();
  h.num_args = static_cast<uint32_t>(launch.args_size());
  h.num_rets = static_cast<uint32_t>(launch.rets_size());
  h.target_len = static_cast<uint32_t>(target.size());
  h.platform_len = static_cast<uint32_t>(platform.size());
  h.attrs_len = static_cast<uint32_t>(attrs_.size());
  char* p = slot;
  memcpy(p, &h, sizeof(h));
  p += sizeof(h);
  memcpy(p, target.data(), target.size());
  p += target.size();
  memcpy(p, platform.data(), platform.size());
  p += platform.size();
  while ((p - slot) % 8 != 0) *p++ = 0;
  for (const auto* list : {&launch.args(), &launch.rets()}) {
    for (const v1::Buffer& b : *list) {
      ring::BufferDesc d{b.dtype(), static_cast<uint32_t>(b.dims_size()),
                         b.offset(), b.size()};
      memcpy(p, &d, sizeof(d));
      p += sizeof(d);
      size_t dims = b.dims_size() * sizeof(int64_t);
      if (dims > 0) memcpy(p, b.dims().data(), dims);
      p += dims;
    }
  }
  memcpy(p, attrs_.data(), attrs_.size());
  ring::Control* c = ring::ControlOf(base_);
  ++sq_tail_;
  ring::Store(c->sq_tail, sq_tail_);
  if (ring::Load(c->sq_waiting) != 0) ring::FutexWake(&c->sq_tail);
  return true;
}

ClientRing::Wait ClientRing::Await(int64_t spin_ns, int64_t slice_ns, int* code,
                                   std::string* message) {
  ring::Control* c = ring::ControlOf(base_);
  if (ring::Load(c->cq_tail) == cq_head_) {
    if (ring::Load(c->closed) != 0) return Wait::kClosed;
    if (!ring::SpinThenWait(&c->cq_tail, cq_head_, &c->cq_waiting, spin_ns,
                            slice_ns)) {
      return ring::Load(c->closed) != 0 ? Wait::kClosed : Wait::kSlice;
    }
  }
  const char* slot = ring::CompleteSlot(base_, cq_head_);
  ring::CompletionHeader h;
  memcpy(&h, slot, sizeof(h));
  size_t n = h.message_len;
  if (n > ring::kMaxMessageBytes) n = ring::kMaxMessageBytes;
  message->assign(slot + sizeof(h), n);
  *code = h.code;
  if (h.tag != tag_) {
    *code = kInternal;
    *message = "kregd completed launch " + std::to_string(h.tag) +
               " on the launch ring instead of " + std::to_string(tag_);
  }
  ++cq_head_;
  ring::Store(c->cq_head, cq_head_);
  return Wait::kDone;
}

}  // namespace shim
}  // namespace kreg
