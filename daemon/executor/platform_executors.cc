#include "daemon/executor/platform_executors.h"

#include "common/platforms.h"
#include "daemon/executor/cpu_executor.h"
#include "daemon/executor/cuda_executor.h"

namespace kreg {
namespace {

constexpr ExecutorRow kRows[] = {
    {Platform::kCpu, &MakeExecutor<CpuExecutor>},
    {Platform::kCuda, &MakeExecutor<CudaExecutor>},
};
static_assert(OneRowPerPlatformInOrder(kRows),
              "one row per platform of common/platforms.h, row i is Platform "
              "i");

PlatformRows<ExecutorRow, 8> g_rows(kRows);

}  // namespace

std::vector<std::unique_ptr<LaunchExecutor>> MakeLaunchExecutors(
    const SessionContext& ctx) {
  std::vector<std::unique_ptr<LaunchExecutor>> out;
  for (size_t i = 0; i < g_rows.size(); ++i) out.push_back(g_rows[i].make(ctx));
  return out;
}

bool AddExecutorRowForTest(const ExecutorRow& row) {
  const size_t next = g_rows.size();
  if (static_cast<size_t>(row.platform) != next || next >= NumPlatforms()) {
    return false;
  }
  return g_rows.Add(row);
}

}  // namespace kreg
