// How this host's GPUs are shared between a client's CUDA context and its
// executor's (DESIGN §8): through the CUDA MPS control daemon (one shared
// GPU context per MPS server, the fast path) or by time-slicing separate
// contexts. kregd reports the mode in `kregctl status` and warns at start
// when it serves GPUs without MPS.
#ifndef KREGD_DAEMON_SUPERVISOR_GPU_SHARING_H_
#define KREGD_DAEMON_SUPERVISOR_GPU_SHARING_H_

#include <string>

#include "absl/status/status.h"
#include "common/mps_control.h"

namespace kreg {

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

#endif  // KREGD_DAEMON_SUPERVISOR_GPU_SHARING_H_
