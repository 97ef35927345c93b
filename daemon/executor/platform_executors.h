// The executor half of the platform table (daemon/base/platform_table.h is the
// half kregd links too): per platform, what makes the LaunchExecutor that
// runs a session's launches of it. kregd-exec and tests only (DESIGN §8).
// A new platform is a row here (docs/adding-a-platform.md).
#ifndef KREGD_DAEMON_EXECUTOR_PLATFORM_EXECUTORS_H_
#define KREGD_DAEMON_EXECUTOR_PLATFORM_EXECUTORS_H_

#include <memory>
#include <vector>

#include "daemon/base/types.h"
#include "daemon/executor/launch_executor.h"

namespace kreg {

// Makes a session's LaunchExecutor of one platform; `ctx` outlives it.
using LaunchExecutorFactory =
    std::unique_ptr<LaunchExecutor> (*)(const SessionContext& ctx);

struct ExecutorRow {
  Platform platform;  // the row's index in common/platforms.h
  LaunchExecutorFactory make;
};

// A factory for a LaunchExecutor constructed from the SessionContext.
template <typename Executor>
std::unique_ptr<LaunchExecutor> MakeExecutor(const SessionContext& ctx) {
  return std::make_unique<Executor>(ctx);
}

// One LaunchExecutor per platform, at its Platform's index.
std::vector<std::unique_ptr<LaunchExecutor>> MakeLaunchExecutors(
    const SessionContext& ctx);

// Tests only (a fake platform): adds the row of the platform
// common/platforms.h's AddPlatformForTest added; false unless row.platform
// is the next index. Not thread-safe: call before any session starts.
bool AddExecutorRowForTest(const ExecutorRow& row);

}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_PLATFORM_EXECUTORS_H_
