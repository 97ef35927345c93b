#include "client/shim/ring_client.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/ring_encode.h"
#include "common/ring_layout.h"
#include "common/stage_trace.h"
#include "common/status_macros.h"

namespace kreg {
namespace shim {

ClientStatus CreateSharedRegion(const char* name, uint64_t size,
                                const std::string& what, int* fd, char** base) {
  *fd = ::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (*fd < 0) {
    return ClientStatus::Error(kInternal,
                               std::string("memfd_create: ") + strerror(errno));
  }
  const char* step = "create";
  void* p = MAP_FAILED;
  if (::ftruncate(*fd, static_cast<off_t>(size)) == 0 &&
      ::fcntl(*fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) ==
          0) {
    step = "map";
    p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
  }
  if (p == MAP_FAILED) {
    int err = errno;
    ::close(*fd);
    *fd = -1;
    return ClientStatus::Error(
        kResourceExhausted,
        std::string("cannot ") + step + " " + what + ": " + strerror(err));
  }
  *base = static_cast<char*>(p);
  return ClientStatus::Ok();
}

ClientStatus ClientRing::Create(int64_t spin_ns,
                                std::unique_ptr<ClientRing>* out) {
  int fd;
  char* base;
  KREG_RETURN_IF_ERROR(CreateSharedRegion("kreg-ring", ring::kRegionBytes,
                                          "the launch ring", &fd, &base));
  ring::Control* c = ring::ControlOf(base);
  c->magic = ring::kMagic;
  c->version = ring::kVersion;
  out->reset(new ClientRing(fd, base, spin_ns));
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

bool ClientRing::Submit(const ring::DescriptorView& launch, uint64_t tag) {
  char* slot = ring::SubmitSlot(base_, sq_tail_);
  if (ring::EncodeDescriptor(launch, sq_tail_, tag, slot,
                             ring::kSubmitSlotBytes) == 0) {
    return false;
  }
  tags_[sq_tail_ % ring::kSlots] = tag;
  ring::Control* c = ring::ControlOf(base_);
  if (stage::Current() != nullptr) {
    // A traced call (KREG_TRACE_STAGES=1): the executor stamps its stages.
    reinterpret_cast<ring::SubmitHeader*>(slot)->flags |= ring::kSubmitTrace;
    stage::Mark(stage::kPublished);
  }
  ++sq_tail_;
  ring::Store(c->sq_tail, sq_tail_);
  if (ring::Load(c->sq_waiting) != 0) ring::FutexWake(&c->sq_tail);
  return true;
}

bool ClientRing::Ready() const {
  return in_flight() > 0 &&
         ring::Load(ring::ControlOf(base_)->cq_tail) != cq_head_;
}

ClientRing::Wait ClientRing::Await(int64_t slice_ns, int* code,
                                   std::string* message, uint32_t* flags) {
  ring::Control* c = ring::ControlOf(base_);
  if (ring::Load(c->cq_tail) == cq_head_) {
    if (ring::Load(c->closed) != 0) return Wait::kClosed;
    if (!ring::SpinThenWait(&c->cq_tail, cq_head_, &c->cq_waiting, &spin_,
                            slice_ns)) {
      return ring::Load(c->closed) != 0 ? Wait::kClosed : Wait::kSlice;
    }
  }
  const char* slot = ring::CompleteSlot(base_, cq_head_);
  ring::CompletionHeader h;
  memcpy(&h, slot, sizeof(h));
  if (stage::Current() != nullptr) {
    stage::Mark(stage::kWoke);
    ring::StageTrailer t;
    memcpy(&t, ring::TrailerOf(slot), sizeof(t));
    stage::Times& s = *stage::Current();
    // Only this launch's stamps (a stale trailer is older than it).
    if (t.present == 1 && t.picked_ns >= s.ns[stage::kPublished]) {
      s.ns[stage::kPicked] = t.picked_ns;
      s.ns[stage::kDecoded] = t.decoded_ns;
      s.ns[stage::kHandlerStart] = t.handler_start_ns;
      s.ns[stage::kHandlerEnd] = t.handler_end_ns;
      s.ns[stage::kCompleted] = t.completed_ns;
    }
  }
  size_t n = h.message_len;
  if (n > ring::kMaxMessageBytes) n = ring::kMaxMessageBytes;
  message->assign(slot + sizeof(h), n);
  *code = h.code;
  if (flags != nullptr) *flags = h.flags;
  const uint64_t want = tags_[cq_head_ % ring::kSlots];
  if (h.tag != want) {
    *code = kInternal;
    *message = "kregd completed launch " + std::to_string(h.tag) +
               " on the launch ring instead of " + std::to_string(want);
    if (flags != nullptr) *flags = 0;
  }
  ++cq_head_;
  ring::Store(c->cq_head, cq_head_);
  return Wait::kDone;
}

}  // namespace shim
}  // namespace kreg
