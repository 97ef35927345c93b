#include "client/shim/module_upload.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

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

ClientStatus CallRegister(Conn* conn, const v1::RegisterRequest& request,
                          v1::SessionResponse* response) {
  const bool upload = request.module_case() == v1::RegisterRequest::kUpload;
  const uint64_t limit = conn->max_module_bytes();
  if (upload && limit != 0 && request.upload().size() > limit) {
    return ClientStatus::Error(
        kInvalidArgument,
        "module of " + std::to_string(request.upload().size()) +
            " bytes for target \"" + request.target_name() +
            "\" exceeds kregd's max_module_bytes (" + std::to_string(limit) +
            "); nothing was sent. Raise max_module_bytes in kregd's config "
            "(or --max-module-bytes) or ship a smaller module");
  }
  v1::SessionRequest req;
  if (!upload || limit == 0) {
    *req.mutable_register_target() = request;
    return conn->Call(&req, response);
  }
  std::string error;
  int fd = SealedMemfd(request.upload(), &error);
  if (fd < 0) return ClientStatus::Error(kInternal, error);
  v1::RegisterRequest* r = req.mutable_register_target();
  r->set_target_name(request.target_name());
  r->set_func_name(request.func_name());
  r->set_platform(request.platform());
  r->set_replace(request.replace());
  r->set_content_id(request.content_id());
  r->set_in_process(request.in_process());
  r->set_upload_fd_size(request.upload().size());
  ClientStatus s = conn->Call(&req, response, &fd, 1);
  ::close(fd);
  return s;
}

}  // namespace shim
}  // namespace kreg
