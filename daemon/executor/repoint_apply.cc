#include "daemon/executor/repoint_apply.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "daemon/base/sha256.h"
#include "daemon/base/validate.h"

namespace kreg {
namespace {

// The SHA-256 digest of the file behind `fd` ("sha256:<hex>").
absl::StatusOr<std::string> DigestOf(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError("the attached module is no regular file");
  }
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    ssize_t n = ::pread(fd, bytes.data() + got, bytes.size() - got,
                        static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::InternalError(
          absl::StrCat("reading the attached module: ",
                       n < 0 ? strerror(errno) : "unexpected end of file"));
    }
    got += static_cast<size_t>(n);
  }
  return Sha256Digest(bytes);
}

absl::Status Apply(const v1::ExecRepoint& r, std::vector<UniqueFd> fds,
                   ModuleCache* modules, RepointTable* table) {
  KREG_RETURN_IF_ERROR(ValidateTargetName(r.target_name()));
  KREG_ASSIGN_OR_RETURN(Platform platform, ParsePlatform(r.platform()));
  if (fds.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        fds.size(), " descriptors attached; expected the module's one"));
  }
  KREG_ASSIGN_OR_RETURN(std::string digest, DigestOf(fds[0].get()));
  if (digest != r.module_digest()) {
    return absl::DataLossError(absl::StrCat("the attached module's digest is ",
                                            digest, ", not ",
                                            r.module_digest()));
  }
  KREG_ASSIGN_OR_RETURN(
      void* handler,
      modules->Handler(r.module_digest(), std::move(fds[0]), r.func_name()));
  table->Set({r.target_name(), platform}, r.generation(), handler, r.token(),
             {r.content_sessions().begin(), r.content_sessions().end()});
  return absl::OkStatus();
}

}  // namespace

v1::ExecRepointAck ApplyRepoint(const v1::ExecRepoint& repoint,
                                std::vector<UniqueFd> fds, ModuleCache* modules,
                                RepointTable* table) {
  absl::Status s = Apply(repoint, std::move(fds), modules, table);
  v1::ExecRepointAck ack;
  ack.set_target_name(repoint.target_name());
  ack.set_platform(repoint.platform());
  ack.set_generation(repoint.generation());
  ack.mutable_status()->set_code(static_cast<int>(s.code()));
  if (!s.ok()) {
    ack.mutable_status()->set_message(absl::StrCat(
        "the executor cannot switch target \"", repoint.target_name(), "\" (",
        repoint.platform(), ") to generation ", repoint.generation(), ": ",
        s.message()));
  }
  return ack;
}

}  // namespace kreg
