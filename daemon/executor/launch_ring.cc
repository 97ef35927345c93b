#include "daemon/executor/launch_ring.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/ring_layout.h"
#include "spdlog/spdlog.h"

namespace kreg {

absl::StatusOr<std::unique_ptr<LaunchRing>> LaunchRing::Map(UniqueFd fd,
                                                            uint64_t size) {
  if (size != ring::kRegionBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("launch ring region of ", size, " bytes; version ",
                     ring::kVersion, " needs exactly ", ring::kRegionBytes));
  }
  int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    spdlog::debug("ring fd {}: F_GET_SEALS = {} ({})", fd.get(), seals,
                  seals < 0 ? strerror(errno) : "no F_SEAL_SHRINK");
    return absl::InvalidArgumentError(
        "launch ring fd must be a memfd sealed with F_SEAL_SHRINK");
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || static_cast<uint64_t>(st.st_size) < size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "launch ring fd holds fewer than the ", size, " bytes announced"));
  }
  void* base =
      ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) {
    spdlog::warn("mmap of a launch ring failed: {}", strerror(errno));
    return absl::InternalError("could not map the launch ring");
  }
  return std::unique_ptr<LaunchRing>(
      new LaunchRing(std::move(fd), static_cast<char*>(base)));
}

LaunchRing::LaunchRing(UniqueFd fd, char* base)
    : fd_(std::move(fd)), base_(base) {
  ring::Control* c = ring::ControlOf(base_);
  // The client may have left anything here. The indices start where its
  // sq_tail is (it sets cq_head to the same value; if not, its first
  // submission reads as a protocol violation); the words below are ours
  // from now on.
  head_ = ring::Load(c->sq_tail);
  cq_tail_ = head_;
  ring::Store(c->sq_head, head_);
  ring::Store(c->sq_waiting, 0);
  ring::Store(c->cq_tail, cq_tail_);
  ring::Store(c->closed, 0);
}

LaunchRing::~LaunchRing() { ::munmap(base_, ring::kRegionBytes); }

LaunchRing::Next LaunchRing::Take(ring::SpinPolicy* spin, std::string* out,
                                  std::string* why) {
  ring::Control* c = ring::ControlOf(base_);
  uint32_t tail;
  for (;;) {
    if (stop_.load(std::memory_order_acquire)) return Next::kStopped;
    tail = ring::Load(c->sq_tail);
    uint32_t avail = tail - head_;
    if (avail > ring::kSlots) {
      *why = absl::StrCat("the client published ", avail,
                          " launch descriptors at once; the ring holds ",
                          ring::kSlots);
      return Next::kBroken;
    }
    if (avail > 0) break;
    ring::SpinThenWait(&c->sq_tail, tail, &c->sq_waiting, spin, -1);
  }
  uint32_t pending = cq_tail_ - ring::Load(c->cq_head);
  if (pending >= ring::kSlots) {
    *why = absl::StrCat(
        "the client submitted with ", pending,
        " completions not consumed (or consumed completions it was never "
        "given); the ring holds ",
        ring::kSlots);
    return Next::kBroken;
  }
  const char* slot = ring::SubmitSlot(base_, head_);
  uint32_t length = __atomic_load_n(reinterpret_cast<const uint32_t*>(slot),
                                    __ATOMIC_RELAXED);
  size_t n = std::clamp<size_t>(length, sizeof(ring::SubmitHeader),
                                ring::kSubmitSlotBytes);
  out->resize(n);
  memcpy(out->data(), slot, n);
  // If the client changed `length` meanwhile (or it was out of range), the
  // copy's header disagrees with n and the decoder refuses it as torn.
  ++head_;
  ring::Store(c->sq_head, head_);
  return Next::kDescriptor;
}

void LaunchRing::Complete(uint64_t tag, const absl::Status& status,
                          uint32_t flags, const ring::StageTrailer* trace) {
  ring::Control* c = ring::ControlOf(base_);
  char* slot = ring::CompleteSlot(base_, cq_tail_);
  ring::CompletionHeader h{};
  h.seq = seq();
  h.code = static_cast<int32_t>(status.code());
  h.tag = tag;
  h.flags = flags;
  absl::string_view msg = status.message();
  std::string cut;
  if (msg.size() > ring::kMaxMessageBytes) {
    std::string marker =
        absl::StrCat(" [... message truncated: ", msg.size(), " bytes in all]");
    cut = absl::StrCat(msg.substr(0, ring::kMaxMessageBytes - marker.size()),
                       marker);
    msg = cut;
    h.truncated = 1;
  }
  h.message_len = static_cast<uint32_t>(msg.size());
  memcpy(slot, &h, sizeof(h));
  if (!msg.empty()) memcpy(slot + sizeof(h), msg.data(), msg.size());
  if (trace != nullptr) {
    memcpy(ring::TrailerOf(slot), trace, sizeof(*trace));
  }
  ++cq_tail_;
  ring::Store(c->cq_tail, cq_tail_);
  if (ring::Load(c->cq_waiting) != 0) ring::FutexWake(&c->cq_tail);
}

void LaunchRing::Stop() {
  stop_.store(true, std::memory_order_release);
  ring::Control* c = ring::ControlOf(base_);
  ring::Store(c->closed, 1);
  ring::FutexWake(&c->sq_tail);
  ring::FutexWake(&c->cq_tail);
}

}  // namespace kreg
