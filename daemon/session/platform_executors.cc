#include "daemon/session/platform_executors.h"

#include "common/platforms.h"
#include "daemon/session/cpu_executor.h"
#include "daemon/session/cuda_executor.h"

namespace kreg {
namespace {

constexpr ExecutorRow kRows[] = {
    {Platform::kCpu, &MakeExecutor<CpuExecutor>},
    {Platform::kCuda, &MakeExecutor<CudaExecutor>},
};
constexpr size_t kNumRows = sizeof(kRows) / sizeof(*kRows);
constexpr bool RowsInOrder() {
  for (size_t i = 0; i < kNumRows; ++i) {
    if (static_cast<size_t>(kRows[i].platform) != i) return false;
  }
  return true;
}
static_assert(kNumRows == kNumPlatforms,
              "one row per platform of common/platforms.h");
static_assert(RowsInOrder(), "row i is Platform i");

ExecutorRow g_added[8];
size_t g_num_added = 0;

}  // namespace

std::vector<std::unique_ptr<LaunchExecutor>> MakeLaunchExecutors(
    const SessionContext& ctx) {
  std::vector<std::unique_ptr<LaunchExecutor>> out;
  for (const ExecutorRow& row : kRows) out.push_back(row.make(ctx));
  for (size_t i = 0; i < g_num_added; ++i) {
    out.push_back(g_added[i].make(ctx));
  }
  return out;
}

bool AddExecutorRowForTest(const ExecutorRow& row) {
  const size_t next = kNumRows + g_num_added;
  if (static_cast<size_t>(row.platform) != next || next >= NumPlatforms() ||
      g_num_added == sizeof(g_added) / sizeof(*g_added)) {
    return false;
  }
  g_added[g_num_added++] = row;
  return true;
}

}  // namespace kreg
