#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "client/shim/client.h"

namespace kreg {
namespace shim {
namespace {

// A memfd holding `bytes`, sealed so that kregd reads exactly what was
// written. -1 and `*error` set on failure.
int SealedMemfd(const std::string& bytes, std::string* error) {
  int fd = ::memfd_create("kreg-module", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    *error = std::string("memfd_create: ") + std::strerror(errno);
    return -1;
  }
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *error =
          std::string("writing the module to a memfd: ") + std::strerror(errno);
      ::close(fd);
      return -1;
    }
    done += static_cast<size_t>(n);
  }
  if (::fcntl(fd, F_ADD_SEALS,
              F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
    *error = std::string("sealing the module memfd: ") + std::strerror(errno);
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

ClientStatus CallRegister(Conn* conn, const Registration& registration,
                          uint64_t max_module_bytes,
                          v1::SessionResponse* response) {
  const v1::RegisterTargetHeader& header = registration.header;
  const bool upload =
      header.module().source_case() == v1::ModuleSource::kUploadSize;
  const std::string& bytes = registration.module;
  const uint64_t limit = max_module_bytes;
  if (upload && limit != 0 && bytes.size() > limit) {
    return ClientStatus::Error(
        kInvalidArgument,
        "module of " + std::to_string(bytes.size()) + " bytes for target \"" +
            header.target_name() + "\" exceeds kregd's max_module_bytes (" +
            std::to_string(limit) +
            "); nothing was sent. Raise max_module_bytes in kregd's config "
            "(or --max-module-bytes) or ship a smaller module");
  }
  v1::SessionRequest req;
  *req.mutable_register_target() = header;
  if (!upload) return conn->Call(&req, response);
  req.mutable_register_target()->mutable_module()->set_upload_size(
      bytes.size());
  std::string error;
  int fd = SealedMemfd(bytes, &error);
  if (fd < 0) return ClientStatus::Error(kInternal, error);
  ClientStatus s = conn->Call(&req, response, &fd, 1);
  ::close(fd);
  return s;
}

}  // namespace shim
}  // namespace kreg
