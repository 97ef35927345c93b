#include "daemon/gpu_sharing.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

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
  struct stat st {};
  if (::lstat(m.control_path.c_str(), &st) != 0) {
    int err = errno;
    m.detail = err == ENOENT
                   ? absl::StrCat("no MPS control daemon: ", m.control_path,
                                  " does not exist")
                   : absl::StrCat("no MPS control daemon: cannot stat ",
                                  m.control_path, ": ", strerror(err));
    return m;
  }
  if (S_ISSOCK(st.st_mode)) {
    int err = ConnectOnce(m.control_path);
    if (err == 0) {
      m.live = true;
      m.detail = absl::StrCat("MPS control daemon at ", m.control_path);
    } else if (err == ECONNREFUSED) {
      m.detail = absl::StrCat(
          "no MPS control daemon: ", m.control_path,
          " is stale (nothing listens on it: connect: ", strerror(err),
          "); the daemon that created it is gone");
    } else {
      m.detail = absl::StrCat(
          "no MPS control daemon reachable by kregd: ", "connect to ",
          m.control_path, ": ", strerror(err));
    }
    return m;
  }
  if (S_ISFIFO(st.st_mode)) {
    // A FIFO opened for writing without blocking fails with ENXIO unless a
    // process has it open for reading (the daemon always does).
    int fd = ::open(m.control_path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    int err = fd >= 0 ? 0 : errno;
    if (fd >= 0) ::close(fd);
    if (err == 0) {
      m.live = true;
      m.detail = absl::StrCat("MPS control daemon at ", m.control_path);
    } else if (err == ENXIO) {
      m.detail = absl::StrCat("no MPS control daemon: ", m.control_path,
                              " is stale (a FIFO nobody reads)");
    } else {
      m.detail =
          absl::StrCat("no MPS control daemon reachable by kregd: ", "open ",
                       m.control_path, ": ", strerror(err));
    }
    return m;
  }
  m.detail = absl::StrCat("no MPS control daemon: ", m.control_path,
                          " is neither a socket nor a FIFO");
  return m;
}

GpuSharing DescribeGpuSharing(const absl::Status& cuda, const MpsControl& mps) {
  if (!cuda.ok()) {
    return {"none",
            absl::StrCat("no GPU: ", cuda.message(), " (", mps.detail, ")")};
  }
  return {mps.live ? "mps" : "time-sliced", mps.detail};
}

std::string GpuSharingWarning(const GpuSharing& sharing,
                              const MpsControl& mps) {
  if (sharing.mode != "time-sliced") return "";
  return absl::StrCat(
      "GPU sharing: time-sliced (", mps.detail,
      "). Each client's and its executor's CUDA contexts take turns on the "
      "GPU, so a small forwarded CUDA call can take ~450 us instead of "
      "~100 us in runs of slow calls. Run the CUDA MPS control daemon for "
      "the fast path: `systemctl enable --now nvidia-mps.service` (shipped "
      "as daemon/systemd/nvidia-mps.service), with the same "
      "CUDA_MPS_PIPE_DIRECTORY for kregd and its clients (kregd looks in ",
      mps.pipe_dir,
      "), then restart kregd. Under MPS a fatal GPU fault can take down every "
      "client of that MPS server (docs/operator-guide.md, GPU sharing)");
}

}  // namespace kreg
