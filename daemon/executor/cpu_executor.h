// The CPU launches of a session: decoded from the arena, run on the
// session's thread by the backend's FFI host.
#ifndef KREGD_DAEMON_EXECUTOR_CPU_EXECUTOR_H_
#define KREGD_DAEMON_EXECUTOR_CPU_EXECUTOR_H_

#include <cstdint>
#include <vector>

#include "daemon/executor/ffi/ffi_host.h"
#include "daemon/executor/launch_executor.h"

namespace kreg {

class CpuExecutor final : public LaunchExecutor {
 public:
  // The call-frame cache is charged to ctx.budget.
  explicit CpuExecutor(const SessionContext& ctx)
      : ctx_(ctx), frames_(ctx.budget) {}

  // INVALID_ARGUMENT when descriptors are attached; then decodes (arena
  // buffers, no resolver) and Runs.
  absl::Status Launch(Request* request) override;
  // Resolves and runs the handler of a decoded launch (socket or launch
  // ring), telling the backend which request runs it. The handler's error
  // verbatim. The call frame is kept for the next Run: `decoded`'s
  // attributes must stay unmodified while its attrs_generation is unchanged.
  absl::Status Run(uint64_t request_id, const DecodedLaunch& decoded);

 private:
  const SessionContext ctx_;
  CallFrameCache frames_;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_CPU_EXECUTOR_H_
