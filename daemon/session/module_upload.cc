#include "daemon/session/module_upload.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace kreg {

absl::StatusOr<std::string> ReadModuleFd(int fd, uint64_t size,
                                         uint64_t max_module_bytes) {
  if (size == 0) {
    return absl::InvalidArgumentError("uploaded module is empty (0 bytes)");
  }
  if (size > max_module_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "uploaded module of ", size, " bytes exceeds the limit of ",
        max_module_bytes, " bytes (max_module_bytes)"));
  }
  std::string bytes(size, '\0');
  uint64_t done = 0;
  while (done < size) {
    ssize_t n =
        ::pread(fd, &bytes[done], size - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      spdlog::info("module upload fd: pread: {}", std::strerror(errno));
      return absl::InvalidArgumentError(
          "the file descriptor attached to the module upload cannot be read");
    }
    if (n == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the module upload announced ", size,
                       " bytes but its file descriptor holds ", done));
    }
    done += static_cast<uint64_t>(n);
  }
  return bytes;
}

}  // namespace kreg
