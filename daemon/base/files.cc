#include "daemon/base/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/unique_fd.h"

namespace kreg {

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

absl::Status MakeDirs(const std::string& dir, mode_t mode) {
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      const std::string part = dir.substr(0, i);
      if (::mkdir(part.c_str(), mode) != 0 && errno != EEXIST) {
        return ErrnoError("cannot create directory", part);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ErrnoError(absl::string_view what, absl::string_view path) {
  return absl::InternalError(absl::StrCat(what, path.empty() ? "" : " ", path,
                                          ": ", std::strerror(errno)));
}

absl::Status WriteAll(int fd, absl::string_view bytes, absl::string_view what) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoError("cannot write", what);
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, std::string* out, size_t limit,
                     absl::string_view what) {
  char buf[65536];
  for (size_t got = 0;;) {
    // One byte past the limit at most: enough to tell that there is more.
    const size_t want = std::min(sizeof(buf) - 1, limit - got) + 1;
    ssize_t n = ::read(fd, buf, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("cannot read", what);
    if (n == 0) return absl::OkStatus();
    if ((got += static_cast<size_t>(n)) > limit) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what, " holds more than ", limit, " bytes"));
    }
    out->append(buf, static_cast<size_t>(n));
  }
}

absl::StatusOr<std::string> ReadFile(const std::string& path, size_t limit) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.ok() && errno == ENOENT) {
    return absl::NotFoundError(absl::StrCat(path, " does not exist"));
  }
  if (!fd.ok()) return ErrnoError("cannot open", path);
  std::string out;
  KREG_RETURN_IF_ERROR(ReadAll(fd.get(), &out, limit, path));
  return out;
}

absl::Status SyncDir(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.ok() && ::fsync(fd.get()) == 0) return absl::OkStatus();
  return ErrnoError("cannot fsync directory", dir);
}

absl::StatusOr<std::string> WriteTempFile(const std::string& dir,
                                          absl::string_view name,
                                          absl::string_view bytes,
                                          mode_t mode) {
  std::string tmp = absl::StrCat(dir, "/.tmp-", name, "-XXXXXX");
  UniqueFd fd(::mkostemp(tmp.data(), O_CLOEXEC));
  if (!fd.ok()) return ErrnoError("cannot create a temp file in", dir);
  absl::Status st = WriteAll(fd.get(), bytes, tmp);
  if (st.ok() && ::fchmod(fd.get(), mode) != 0)
    st = ErrnoError("cannot chmod", tmp);
  if (st.ok() && ::fsync(fd.get()) != 0) st = ErrnoError("cannot fsync", tmp);
  if (st.ok()) return tmp;
  ::unlink(tmp.c_str());
  return st;
}

absl::Status CommitTempFile(const std::string& temp, const std::string& path) {
  if (::rename(temp.c_str(), path.c_str()) == 0) return SyncDir(DirOf(path));
  absl::Status st =
      ErrnoError(absl::StrCat("cannot rename ", temp, " to"), path);
  ::unlink(temp.c_str());
  return st;
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view bytes, mode_t mode) {
  absl::StatusOr<std::string> tmp =
      WriteTempFile(DirOf(path), path.substr(path.rfind('/') + 1), bytes, mode);
  return tmp.ok() ? CommitTempFile(*tmp, path) : tmp.status();
}

}  // namespace kreg
