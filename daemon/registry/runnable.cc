#include "daemon/registry/runnable.h"

#include "absl/strings/str_cat.h"
#include "common/cuda_driver.h"
#include "daemon/base/platform_table.h"

namespace kreg {

std::string NotRunnableReason(const TargetEntry& entry,
                              const absl::Status& cuda) {
  if (entry.kind == TargetKind::kInProcess) return "";
  if (!entry.unavailable.empty()) {
    return absl::StrCat("its module could not be loaded (", entry.unavailable,
                        ")");
  }
  if (TraitsOf(entry.key.platform).memory == PlatformMemory::kCuda &&
      !cuda.ok()) {
    return absl::StrCat("this kregd cannot run CUDA launches: ",
                        cuda.message());
  }
  return "";
}

namespace {

absl::Status ProbeCudaLaunches() {
  std::string error;
  const cu::CudaDriver* driver = cu::LoadCudaDriver(&error);
  if (driver == nullptr) return absl::UnavailableError(error);
  if (cu::CUresult r = driver->cuInit(0); r != cu::CUDA_SUCCESS) {
    return absl::UnavailableError(
        absl::StrCat("no CUDA device: cuInit failed (CUresult ", r, ")"));
  }
  int count = 0;
  if (driver->cuDeviceGetCount(&count) != cu::CUDA_SUCCESS || count == 0) {
    return absl::UnavailableError("no CUDA device is visible");
  }
  return absl::OkStatus();
}

}  // namespace

const absl::Status& CudaLaunchStatus() {
  static const absl::Status* status = new absl::Status(ProbeCudaLaunches());
  return *status;
}

}  // namespace kreg
