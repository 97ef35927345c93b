#include "daemon/base/unix_listener.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/base/files.h"
#include "daemon/base/log_limit.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

bool Fill(const std::string& path, sockaddr_un* addr) {
  if (path.empty() || path.size() >= sizeof(addr->sun_path)) return false;
  *addr = sockaddr_un{};
  addr->sun_family = AF_UNIX;
  memcpy(addr->sun_path, path.c_str(), path.size() + 1);
  return true;
}

bool IsLive(const sockaddr_un& addr) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  return fd.ok() &&
         ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr),
                   sizeof(addr)) == 0;
}

}  // namespace

absl::StatusOr<UnixListener> UnixListener::Bind(const std::string& path,
                                                mode_t mode, gid_t gid,
                                                const std::string& what) {
  sockaddr_un addr;
  if (!Fill(path, &addr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " path \"", path, "\" is empty or longer than ",
        sizeof(addr.sun_path) - 1, " bytes; choose a shorter --socket"));
  }
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, " path ", path,
                       " exists and is not a socket; remove it or pass a "
                       "different --socket"));
    }
    if (IsLive(addr)) {
      return absl::AlreadyExistsError(
          absl::StrCat("another daemon is already serving ", path,
                       "; stop it first or pass a different --socket"));
    }
  }
  // The temporary name; when it does not fit a socket address, the path
  // itself (replacing a stale socket non-atomically, as before).
  std::string tmp = absl::StrCat(path, ".new.", ::getpid());
  sockaddr_un tmp_addr;
  const bool atomic = Fill(tmp, &tmp_addr);
  if (!atomic) {
    tmp = path;
    tmp_addr = addr;
  }
  ::unlink(tmp.c_str());
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.ok()) return ErrnoError("socket(AF_UNIX)");
  // Created with its final mode: no window in which others may connect.
  const mode_t old_mask = ::umask(~mode & 0777);
  const int rc = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&tmp_addr),
                        sizeof(tmp_addr));
  ::umask(old_mask);
  if (rc != 0) return ErrnoError(absl::StrCat("cannot bind ", tmp));
  auto fail = [&](const std::string& call) {
    absl::Status s = ErrnoError(call);
    ::unlink(tmp.c_str());
    return s;
  };
  if (::chmod(tmp.c_str(), mode) != 0) return fail("chmod " + tmp);
  if (gid != static_cast<gid_t>(-1) &&
      ::chown(tmp.c_str(), static_cast<uid_t>(-1), gid) != 0) {
    return fail(absl::StrCat("cannot give ", tmp, " to gid ", gid));
  }
  if (::listen(fd.get(), 128) != 0) return fail("listen " + tmp);
  if (atomic && ::rename(tmp.c_str(), path.c_str()) != 0) {
    return fail(absl::StrCat("rename ", tmp, " to ", path));
  }
  if (::lstat(path.c_str(), &st) != 0) return ErrnoError("stat " + path);
  return UnixListener(std::move(fd), path, st.st_ino, st.st_dev);
}

UnixListener::UnixListener(UniqueFd fd, std::string path, ino_t ino, dev_t dev)
    : fd_(std::move(fd)), path_(std::move(path)), ino_(ino), dev_(dev) {}

UnixListener::~UnixListener() {
  if (!fd_.ok() || path_.empty()) return;
  struct stat st;
  if (::lstat(path_.c_str(), &st) == 0 && st.st_ino == ino_ &&
      st.st_dev == dev_) {
    ::unlink(path_.c_str());
  }
}

std::chrono::milliseconds AcceptFailed(const std::string& what, int err) {
  static LogLimiter* const log =
      new LogLimiter(1, std::chrono::seconds(10));  // never destroyed
  constexpr std::chrono::milliseconds kPause(100);
  std::string suffix;
  if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
    if (log->Allow(what, &suffix)) {
      spdlog::warn(
          "{}: accept: {}; accepting again in {} ms (raise kregd's descriptor "
          "limit, LimitNOFILE, above max_grpc_connections + max_sessions){}",
          what, strerror(err), kPause.count(), suffix);
    }
    return kPause;
  }
  if (err != EINTR && err != EAGAIN && err != ECONNABORTED) {
    spdlog::warn("{}: accept: {}", what, strerror(err));
  }
  return std::chrono::milliseconds(0);
}

}  // namespace kreg
