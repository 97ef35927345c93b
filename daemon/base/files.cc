#include "daemon/base/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/unique_fd.h"

namespace kreg {
namespace {

absl::Status Errno(absl::string_view what, absl::string_view path) {
  return absl::InternalError(
      absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// The directory of `path`, where its temp file goes and what is fsynced.
std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

absl::Status WriteAll(int fd, absl::string_view bytes, absl::string_view what) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("cannot write", what);
    if (n == 0) {
      return absl::InternalError(
          absl::StrCat("cannot write ", what, ": write() took no bytes"));
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, std::string* out, size_t limit,
                     absl::string_view what) {
  char buf[65536];
  for (size_t got = 0;;) {
    // One byte past the limit at most: enough to tell that there is more.
    const size_t room = limit - got;
    const size_t want = room < sizeof(buf) ? room + 1 : sizeof(buf);
    ssize_t n = ::read(fd, buf, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("cannot read", what);
    if (n == 0) return absl::OkStatus();
    got += static_cast<size_t>(n);
    if (got > limit) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what, " holds more than ", limit, " bytes"));
    }
    out->append(buf, static_cast<size_t>(n));
  }
}

absl::Status SyncDir(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.ok() || ::fsync(fd.get()) != 0) {
    return Errno("cannot fsync directory", dir);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> WriteTempFile(const std::string& dir,
                                          absl::string_view name,
                                          absl::string_view bytes,
                                          mode_t mode) {
  std::string tmp = absl::StrCat(dir, "/.tmp-", name, "-XXXXXX");
  UniqueFd fd(::mkostemp(tmp.data(), O_CLOEXEC));
  if (!fd.ok()) return Errno("cannot create a temp file in", dir);
  absl::Status st = WriteAll(fd.get(), bytes, tmp);
  if (st.ok() && ::fchmod(fd.get(), mode) != 0) st = Errno("cannot chmod", tmp);
  if (st.ok() && ::fsync(fd.get()) != 0) st = Errno("cannot fsync", tmp);
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  return tmp;
}

absl::Status CommitTempFile(const std::string& temp, const std::string& path) {
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    absl::Status st = Errno(absl::StrCat("cannot rename ", temp, " to"), path);
    ::unlink(temp.c_str());
    return st;
  }
  return SyncDir(DirOf(path));
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view bytes, mode_t mode) {
  absl::StatusOr<std::string> tmp =
      WriteTempFile(DirOf(path), path.substr(path.rfind('/') + 1), bytes, mode);
  if (!tmp.ok()) return tmp.status();
  return CommitTempFile(*tmp, path);
}

}  // namespace kreg
