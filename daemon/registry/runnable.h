// Whether this kregd can run a registered target (docs/errors.md "Not
// runnable here"): a cuda
// target registered on a daemon without a usable GPU is accepted (the name
// is reserved for every process, as always) but cannot be called here; the
// replies and `kregctl list` say so instead of letting the call fail inside
// XLA.
#ifndef KREGD_DAEMON_REGISTRY_RUNNABLE_H_
#define KREGD_DAEMON_REGISTRY_RUNNABLE_H_

#include <string>

#include "absl/status/status.h"
#include "daemon/base/types.h"

namespace kreg {

// Empty when kregd can run `entry`; otherwise a sentence saying why not.
// `cuda` is the status of kregd's GPUs (CudaDevices::status(): OK when it
// serves CUDA launches). In-process targets run in their owner process and
// are always runnable as far as kregd is concerned.
std::string NotRunnableReason(const TargetEntry& entry,
                              const absl::Status& cuda);

// Whether executors on this host can run CUDA launches: OK when libcuda.so.1
// loads, cuInit succeeds and at least one device is visible; UNAVAILABLE
// saying why otherwise. Probed once per process (thread-safe); creates no
// CUDA context (kregd keeps none).
const absl::Status& CudaLaunchStatus();

}  // namespace kreg

#endif  // KREGD_DAEMON_REGISTRY_RUNNABLE_H_
