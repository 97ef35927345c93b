// How this host's GPUs are shared between a client's CUDA context and its
// executor's (DESIGN §8): through the CUDA MPS control daemon (one shared
// GPU context per MPS server, the fast path) or by time-slicing separate
// contexts. kregd reports the mode in `kregctl status` and warns at start
// when it serves GPUs without MPS.
#ifndef KREGD_DAEMON_GPU_SHARING_H_
#define KREGD_DAEMON_GPU_SHARING_H_

#include <string>

#include "absl/status/status.h"

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

// "mps", "time-sliced" or "none".
struct GpuSharing {
  std::string mode;
  // Why: "<MpsControl::detail>", or without a GPU "no GPU: <cuda's
  // reason> (<MpsControl::detail>)".
  std::string note;
};

// `cuda`: whether executors on this host can run CUDA launches
// (CudaLaunchStatus()). No GPU: "none"; a GPU and a live MPS control
// daemon: "mps"; a GPU without one: "time-sliced".
GpuSharing DescribeGpuSharing(const absl::Status& cuda, const MpsControl& mps);

// The start-up warning for "time-sliced": what it costs and how to enable
// MPS. Empty for the other modes.
std::string GpuSharingWarning(const GpuSharing& sharing, const MpsControl& mps);

}  // namespace kreg

#endif  // KREGD_DAEMON_GPU_SHARING_H_
