#include "daemon/executor/shm_arena.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

// Where zero-size buffers point when the arena is empty: handlers may not
// dereference them, but some compare them against null.
alignas(64) char kEmptyRegion[64];

}  // namespace

ShmArena::ShmArena(uint64_t max_bytes) : max_bytes_(max_bytes) {}

ShmArena::~ShmArena() { Reset(); }

void ShmArena::Reset() {
  if (base_ != nullptr) ::munmap(base_, size_);
  base_ = nullptr;
  size_ = 0;
  fd_.reset();
}

absl::Status ShmArena::Replace(UniqueFd fd, uint64_t size) {
  if (size == 0) {
    return absl::InvalidArgumentError("arena size must be positive, got 0");
  }
  if (size > max_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("arena of ", size, " bytes exceeds the daemon's limit of ",
                     max_bytes_, " bytes (max_arena_bytes)"));
  }
  int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    spdlog::debug("arena fd {}: F_GET_SEALS = {} ({})", fd.get(), seals,
                  seals < 0 ? strerror(errno) : "no F_SEAL_SHRINK");
    return absl::InvalidArgumentError(
        "arena fd must be a memfd sealed with F_SEAL_SHRINK");
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("arena fd cannot be inspected: ", strerror(errno)));
  }
  if (static_cast<uint64_t>(st.st_size) < size) {
    return absl::InvalidArgumentError(
        absl::StrCat("arena fd holds ", st.st_size, " bytes, less than the ",
                     size, " bytes announced"));
  }
  void* base =
      ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) {
    spdlog::warn("mmap of a {} byte arena failed: {}", size, strerror(errno));
    return absl::InternalError(
        absl::StrCat("could not map an arena of ", size, " bytes"));
  }
  Reset();
  fd_ = std::move(fd);
  base_ = static_cast<char*>(base);
  size_ = size;
  return absl::OkStatus();
}

absl::StatusOr<char*> ShmArena::Region(uint64_t offset, uint64_t size) const {
  uint64_t end;
  if (__builtin_add_overflow(offset, size, &end)) {
    return absl::OutOfRangeError(
        absl::StrCat("region offset ", offset, " + size ", size, " overflows"));
  }
  if (end > size_) {
    return absl::OutOfRangeError(
        absl::StrCat("region [", offset, ", ", end,
                     ") ends past the session arena of ", size_, " bytes"));
  }
  if (base_ == nullptr) return kEmptyRegion;
  return base_ + offset;
}

}  // namespace kreg
