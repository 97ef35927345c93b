// Whether a CUDA MPS control daemon serves this process's pipe directory,
// probed without a CUDA call. Shared by kregd (gpu_sharing in `kregctl
// status`, the start-up warning) and the shim (KREG_ASYNC_LAUNCH is only
// worth it under MPS). libc only.
#ifndef KREGD_COMMON_MPS_CONTROL_H_
#define KREGD_COMMON_MPS_CONTROL_H_

#include <string>

namespace kreg {

// What the MPS control daemon's pipe directory says.
struct MpsControl {
  // A process serves `control_path`: a Unix socket that accepts a
  // connection (or exists bound with another socket type), or a FIFO that
  // has a reader.
  bool live = false;
  std::string pipe_dir;      // $CUDA_MPS_PIPE_DIRECTORY or /tmp/nvidia-mps
  std::string control_path;  // <pipe_dir>/control
  // One sentence: "MPS control daemon at <path>" or why there is none
  // ("<path> does not exist", "stale: nothing listens on <path> ...").
  std::string detail;
};

// The pipe directory CUDA clients of this process use: `env_value` (the
// value of $CUDA_MPS_PIPE_DIRECTORY; null or empty: unset) or
// /tmp/nvidia-mps.
std::string MpsPipeDir(const char* env_value);

// Probes <pipe_dir>/control without blocking and without a CUDA call: a
// socket is live when connect() succeeds (or is in progress, or is refused
// only for its socket type); ECONNREFUSED means a stale socket file left by
// a daemon that is gone. A FIFO is live when a non-blocking open for
// writing finds a reader. The connection is closed at once, unused (the
// control daemon sees a client that went away).
MpsControl ProbeMpsControl(const std::string& pipe_dir);

}  // namespace kreg

#endif  // KREGD_COMMON_MPS_CONTROL_H_
