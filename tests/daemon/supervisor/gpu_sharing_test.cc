// daemon/gpu_sharing: the MPS control daemon probe on real sockets and
// FIFOs in a temporary pipe directory (no GPU, no MPS needed).
#include "daemon/supervisor/gpu_sharing.h"

#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <string>

#include "catch2/catch.hpp"
#include "tests/testing/temp_dir.h"

namespace kreg {
namespace {

// A Unix socket bound at `path`; listening when `listen_too`.
int BindAt(const std::string& path, int type, bool listen_too) {
  int fd = ::socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  REQUIRE(path.size() < sizeof(addr.sun_path));
  memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  if (listen_too) REQUIRE(::listen(fd, 4) == 0);
  return fd;
}

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST_CASE("MpsPipeDir: the environment's directory, else /tmp/nvidia-mps",
          "[gpu_sharing]") {
  CHECK(MpsPipeDir(nullptr) == "/tmp/nvidia-mps");
  CHECK(MpsPipeDir("") == "/tmp/nvidia-mps");
  CHECK(MpsPipeDir("/run/nvidia-mps") == "/run/nvidia-mps");
  CHECK(MpsPipeDir("/run/nvidia-mps//") == "/run/nvidia-mps");
}

TEST_CASE("A live control socket is MPS", "[gpu_sharing]") {
  testing::TempDir dir;
  int fd = BindAt(dir.path() + "/control", SOCK_STREAM, true);
  MpsControl m = ProbeMpsControl(dir.path());
  CHECK(m.live);
  CHECK(m.control_path == dir.path() + "/control");
  CHECK(Contains(m.detail, "MPS control daemon at " + m.control_path));
  ::close(fd);
}

TEST_CASE("A live control socket of another socket type is MPS",
          "[gpu_sharing]") {
  testing::TempDir dir;
  int fd = BindAt(dir.path() + "/control", SOCK_SEQPACKET, true);
  CHECK(ProbeMpsControl(dir.path()).live);
  ::close(fd);
}

TEST_CASE("A stale control socket (its daemon is gone) is not MPS",
          "[gpu_sharing]") {
  testing::TempDir dir;
  // Bound, then closed: the file stays, nothing listens.
  ::close(BindAt(dir.path() + "/control", SOCK_STREAM, true));
  struct stat st {};
  REQUIRE(::lstat((dir.path() + "/control").c_str(), &st) == 0);
  REQUIRE(S_ISSOCK(st.st_mode));
  MpsControl m = ProbeMpsControl(dir.path());
  CHECK_FALSE(m.live);
  CHECK(Contains(m.detail, "is stale"));
  CHECK(Contains(m.detail, dir.path() + "/control"));
}

TEST_CASE("A missing pipe directory is not MPS", "[gpu_sharing]") {
  testing::TempDir dir;
  MpsControl m = ProbeMpsControl(dir.path() + "/no-such-dir");
  CHECK_FALSE(m.live);
  CHECK(Contains(m.detail, "does not exist"));
  CHECK(Contains(m.detail, dir.path() + "/no-such-dir/control"));
}

TEST_CASE("A regular file named control is not MPS", "[gpu_sharing]") {
  testing::TempDir dir;
  int fd = ::open((dir.path() + "/control").c_str(),
                  O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  REQUIRE(fd >= 0);
  ::close(fd);
  MpsControl m = ProbeMpsControl(dir.path());
  CHECK_FALSE(m.live);
  CHECK(Contains(m.detail, "neither a socket nor a FIFO"));
}

TEST_CASE("A control FIFO is MPS only while someone reads it",
          "[gpu_sharing]") {
  testing::TempDir dir;
  std::string path = dir.path() + "/control";
  REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
  MpsControl stale = ProbeMpsControl(dir.path());
  CHECK_FALSE(stale.live);
  CHECK(Contains(stale.detail, "is stale"));
  int reader = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  REQUIRE(reader >= 0);
  CHECK(ProbeMpsControl(dir.path()).live);
  ::close(reader);
}

TEST_CASE("DescribeGpuSharing: none without a GPU, whatever MPS says",
          "[gpu_sharing]") {
  MpsControl live;
  live.live = true;
  live.detail = "MPS control daemon at /x/control";
  GpuSharing g = DescribeGpuSharing(
      absl::UnavailableError("no CUDA device is visible"), live);
  CHECK(g.mode == "none");
  CHECK(g.note ==
        "no GPU: no CUDA device is visible (MPS control daemon at "
        "/x/control)");
  CHECK(GpuSharingWarning(g, live).empty());
}

TEST_CASE("DescribeGpuSharing: mps or time-sliced with a GPU",
          "[gpu_sharing]") {
  MpsControl live;
  live.live = true;
  live.pipe_dir = "/x";
  live.detail = "MPS control daemon at /x/control";
  GpuSharing g = DescribeGpuSharing(absl::OkStatus(), live);
  CHECK(g.mode == "mps");
  CHECK(g.note == live.detail);
  CHECK(GpuSharingWarning(g, live).empty());

  MpsControl stale;
  stale.pipe_dir = "/x";
  stale.detail = "no MPS control daemon: /x/control is stale";
  g = DescribeGpuSharing(absl::OkStatus(), stale);
  CHECK(g.mode == "time-sliced");
  std::string w = GpuSharingWarning(g, stale);
  CHECK(Contains(w, "time-sliced"));
  CHECK(Contains(w, "/x/control is stale"));
  CHECK(Contains(w, "nvidia-mps.service"));
  CHECK(Contains(w, "kregd looks in /x"));
  CHECK(Contains(w, "fatal GPU fault"));
}

}  // namespace
}  // namespace kreg
