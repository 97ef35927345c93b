#include "daemon/base/status_page.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/base/files.h"

namespace kreg {

static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "status page atomics must be lock-free to live in shared memory");
static_assert(std::atomic<uint32_t>::is_always_lock_free);

namespace {

size_t StatsOffset(uint32_t slots) {
  size_t end = sizeof(ExecStatusHeader) + size_t{slots} * sizeof(ExecSlot);
  return (end + 63) / 64 * 64;  // rows start on a cache line
}

}  // namespace

size_t StatusPage::SizeFor(uint32_t slots) {
  size_t bytes = StatsOffset(slots) + size_t{kStatsRows} * sizeof(StatsRow);
  return (bytes + 4095) / 4096 * 4096;
}

StatusPage::StatusPage(UniqueFd fd, void* base, size_t size, uint32_t slots)
    : fd_(std::move(fd)),
      base_(base),
      size_(size),
      slots_(slots),
      header_(static_cast<ExecStatusHeader*>(base)) {}

StatusPage::StatusPage(StatusPage&& o) noexcept
    : fd_(std::move(o.fd_)),
      base_(std::exchange(o.base_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      slots_(o.slots_),
      header_(std::exchange(o.header_, nullptr)) {}

StatusPage& StatusPage::operator=(StatusPage&& o) noexcept {
  if (this != &o) {
    if (base_ != nullptr) ::munmap(base_, size_);
    fd_ = std::move(o.fd_);
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
    slots_ = o.slots_;
    header_ = std::exchange(o.header_, nullptr);
  }
  return *this;
}

StatusPage::~StatusPage() {
  if (base_ != nullptr) ::munmap(base_, size_);
}

absl::StatusOr<StatusPage> StatusPage::Create(uint32_t slots) {
  size_t size = SizeFor(slots);
  UniqueFd fd(
      ::memfd_create("kreg-exec-status", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.ok()) {
    return ErrnoError("memfd_create for an executor status page");
  }
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    return ErrnoError("sizing an executor status page");
  }
  // The executor (and whatever kernel runs in it) holds this fd: it must
  // not be able to shrink the page under kregd's mapping (kregd would take
  // SIGBUS reading it).
  if (::fcntl(fd.get(), F_ADD_SEALS, kPageSeals) != 0) {
    return ErrnoError("sealing an executor status page");
  }
  void* base =
      ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) {
    return ErrnoError("mapping an executor status page");
  }
  StatusPage page(std::move(fd), base, size, slots);
  page.header_->magic = kExecStatusMagic;
  page.header_->slots = slots;
  return page;
}

absl::StatusOr<StatusPage> StatusPage::Map(UniqueFd fd, uint32_t slots,
                                           bool require_seals) {
  size_t size = SizeFor(slots);
  if (require_seals) {
    const int seals = ::fcntl(fd.get(), F_GET_SEALS);
    if (seals < 0 || (seals & kPageSeals) != kPageSeals) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the executor status page offered is not a memfd sealed against "
          "resizing (seals ",
          seals, ", want ", kPageSeals, ")"));
    }
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || static_cast<size_t>(st.st_size) < size) {
    return absl::InvalidArgumentError(
        absl::StrCat("executor status page fd ", fd.get(), " is not a page of ",
                     slots, " slots (", size, " bytes)"));
  }
  void* base =
      ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) {
    return ErrnoError("mapping the status page");
  }
  StatusPage page(std::move(fd), base, size, slots);
  if (page.header_->magic != kExecStatusMagic || page.header_->slots != slots) {
    return absl::InvalidArgumentError("executor status page has a bad header");
  }
  return page;
}

ExecSlot* StatusPage::slot(uint32_t i) const {
  if (i >= slots_) return nullptr;
  return reinterpret_cast<ExecSlot*>(reinterpret_cast<char*>(base_) +
                                     sizeof(ExecStatusHeader)) +
         i;
}

StatsRow* StatusPage::stats_row(uint32_t token) const {
  if (token == 0 || token > kStatsRows) return nullptr;
  return reinterpret_cast<StatsRow*>(static_cast<char*>(base_) +
                                     StatsOffset(slots_)) +
         (token - 1);
}

std::string StatusPage::Note() const {
  std::string out;
  for (size_t i = 0; i < sizeof(header_->note); ++i) {
    char c = header_->note[i];
    if (c == '\0') break;
    out.push_back(c >= 0x20 && c < 0x7f ? c : '?');
  }
  return out;
}

}  // namespace kreg
