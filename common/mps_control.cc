#include "common/mps_control.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

namespace kreg {
namespace {

constexpr char kDefaultPipeDir[] = "/tmp/nvidia-mps";

// connect() to the Unix socket at `path` without blocking: 0 when something
// listens there, else the errno.
int ConnectOnce(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return ENAMETOOLONG;
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int rc;
  do {
    rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  int err = rc == 0 ? 0 : errno;
  ::close(fd);
  // In progress or a full backlog: a listener exists. EPROTOTYPE: a socket
  // of another type is bound there (a stale file refuses every type).
  if (err == EINPROGRESS || err == EAGAIN || err == EPROTOTYPE) return 0;
  return err;
}

}  // namespace

std::string MpsPipeDir(const char* env_value) {
  if (env_value == nullptr || env_value[0] == '\0') return kDefaultPipeDir;
  std::string dir = env_value;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

MpsControl ProbeMpsControl(const std::string& pipe_dir) {
  MpsControl m;
  m.pipe_dir = pipe_dir;
  m.control_path = pipe_dir + "/control";
  const std::string& path = m.control_path;
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    int err = errno;
    m.detail = err == ENOENT
                   ? "no MPS control daemon: " + path + " does not exist"
                   : "no MPS control daemon: cannot stat " + path + ": " +
                         strerror(err);
    return m;
  }
  if (S_ISSOCK(st.st_mode)) {
    int err = ConnectOnce(path);
    if (err == 0) {
      m.live = true;
      m.detail = "MPS control daemon at " + path;
    } else if (err == ECONNREFUSED) {
      m.detail = "no MPS control daemon: " + path +
                 " is stale (nothing listens on it: connect: " + strerror(err) +
                 "); the daemon that created it is gone";
    } else {
      m.detail =
          "no MPS control daemon reachable by this process: connect "
          "to " +
          path + ": " + strerror(err);
    }
    return m;
  }
  if (S_ISFIFO(st.st_mode)) {
    // A FIFO opened for writing without blocking fails with ENXIO unless a
    // process has it open for reading (the daemon always does).
    int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    int err = fd >= 0 ? 0 : errno;
    if (fd >= 0) ::close(fd);
    if (err == 0) {
      m.live = true;
      m.detail = "MPS control daemon at " + path;
    } else if (err == ENXIO) {
      m.detail =
          "no MPS control daemon: " + path + " is stale (a FIFO nobody reads)";
    } else {
      m.detail = "no MPS control daemon reachable by this process: open " +
                 path + ": " + strerror(err);
    }
    return m;
  }
  m.detail =
      "no MPS control daemon: " + path + " is neither a socket nor a FIFO";
  return m;
}

}  // namespace kreg
