#include "daemon/base/module_upload.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

absl::Status CheckSize(uint64_t size, uint64_t max_module_bytes) {
  if (size == 0) {
    return absl::InvalidArgumentError("uploaded module is empty (0 bytes)");
  }
  if (size > max_module_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "uploaded module of ", size, " bytes exceeds the limit of ",
        max_module_bytes, " bytes (max_module_bytes)"));
  }
  return absl::OkStatus();
}

// Reads bytes [done, done + n) of `fd` into `dst` (pread); the upload
// errors of ReadModuleFd.
absl::Status ReadAt(int fd, uint64_t size, uint64_t done, char* dst, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::pread(fd, dst + got, n - got, static_cast<off_t>(done + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      spdlog::info("module upload fd: pread: {}", std::strerror(errno));
      return absl::InvalidArgumentError(
          "the file descriptor attached to the module upload cannot be read");
    }
    if (r == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the module upload announced ", size,
                       " bytes but its file descriptor holds ", done + got));
    }
    got += static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

// The seals of `fd`, its size and the bytes it has storage for, or false
// when it is not a memfd.
bool SealsAndSize(int fd, int* seals, uint64_t* size, uint64_t* allocated) {
  *seals = ::fcntl(fd, F_GET_SEALS);
  struct stat st;
  if (*seals < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return false;
  }
  *size = static_cast<uint64_t>(st.st_size);
  *allocated = static_cast<uint64_t>(st.st_blocks) * 512;
  return true;
}

// A memfd's storage is allocated in pages: one whose bytes were all
// written has at least its size, up to the last page.
constexpr uint64_t kPage = 4096;

}  // namespace

absl::StatusOr<std::string> ReadModuleFd(int fd, uint64_t size,
                                         uint64_t max_module_bytes) {
  KREG_RETURN_IF_ERROR(CheckSize(size, max_module_bytes));
  std::string bytes(size, '\0');
  KREG_RETURN_IF_ERROR(ReadAt(fd, size, 0, bytes.data(), size));
  return bytes;
}

absl::StatusOr<std::string> ReadSealedModule(int fd, uint64_t size,
                                             uint64_t max_module_bytes) {
  KREG_RETURN_IF_ERROR(CheckSize(size, max_module_bytes));
  int seals = 0;
  uint64_t held = 0;
  uint64_t allocated = 0;
  if (!SealsAndSize(fd, &seals, &held, &allocated)) {
    return absl::InvalidArgumentError(
        "the file descriptor attached to the module upload is not a memfd; "
        "send the module as a memfd sealed against writing, shrinking and "
        "growing");
  }
  if ((seals & kModuleSeals) != kModuleSeals) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the module memfd attached to the upload is not sealed against "
        "writing, shrinking and growing (seals 0x",
        absl::Hex(seals),
        "); seal it (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW) before "
        "sending it"));
  }
  if (held != size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the module memfd attached to the upload holds ", held,
        " bytes, not the ", size, " announced in module.upload_size"));
  }
  if (allocated + kPage < size) {
    // Holes cost the sender nothing and kregd a copy and a hash of zeros.
    return absl::InvalidArgumentError(absl::StrCat(
        "the module memfd attached to the upload is sparse: only ", allocated,
        " of its ", size,
        " bytes are written (the rest are holes); write the module's bytes "
        "into the memfd (a module is never sparse)"));
  }
  return ReadModuleFd(fd, size, max_module_bytes);
}

absl::StatusOr<UidAccount::Charge> HoldUpload(UidAccount* account, uid_t uid,
                                              uint64_t size) {
  if (account == nullptr) return UidAccount::Charge();
  absl::StatusOr<UidAccount::Charge> c =
      account->Take(uid, UidResource::kUploadBytes, size);
  if (c.ok()) return c;
  return absl::ResourceExhaustedError(
      absl::StrCat("kregd refused a module upload of ", size,
                   " bytes (counted by its announced size, sparse or not): ",
                   c.status().message()));
}

}  // namespace kreg
