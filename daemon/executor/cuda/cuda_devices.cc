#include "daemon/executor/cuda/cuda_devices.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

using cu::CUresult;

absl::StatusCode CodeOf(CUresult r) {
  switch (r) {
    case cu::CUDA_SUCCESS:
      return absl::StatusCode::kOk;
    case cu::CUDA_ERROR_OUT_OF_MEMORY:
      return absl::StatusCode::kResourceExhausted;
    case cu::CUDA_ERROR_INVALID_VALUE:
    case cu::CUDA_ERROR_INVALID_HANDLE:
    case cu::CUDA_ERROR_INVALID_DEVICE:
      return absl::StatusCode::kInvalidArgument;
    case cu::CUDA_ERROR_NOT_SUPPORTED:
    case cu::CUDA_ERROR_NOT_PERMITTED:
      return absl::StatusCode::kFailedPrecondition;
    case cu::CUDA_ERROR_NO_DEVICE:
    case cu::CUDA_ERROR_NOT_INITIALIZED:
    case cu::CUDA_ERROR_DEINITIALIZED:
    case cu::CUDA_ERROR_STUB_LIBRARY:
    case cu::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
      return absl::StatusCode::kUnavailable;
    default:
      return absl::StatusCode::kInternal;
  }
}

std::string VisibleDevicesNote() {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  if (v == nullptr) return "";
  return absl::StrCat(" (CUDA_VISIBLE_DEVICES=\"", v, "\")");
}

}  // namespace

absl::Status CuStatus(const cu::CudaDriver& driver, CUresult result,
                      absl::string_view what) {
  if (result == cu::CUDA_SUCCESS) return absl::OkStatus();
  return absl::Status(
      CodeOf(result),
      absl::StrCat(what, ": ", DescribeCuResult(driver, result)));
}

CudaDevices::CudaDevices(const cu::CudaDriver* driver, absl::Status status)
    : driver_(driver), status_(std::move(status)) {}

std::unique_ptr<CudaDevices> CudaDevices::Open(const cu::CudaDriver* driver,
                                               absl::string_view driver_error) {
  if (driver == nullptr) {
    auto none = std::unique_ptr<CudaDevices>(new CudaDevices(
        nullptr, absl::UnavailableError(absl::StrCat(
                     driver_error.empty() ? "no CUDA driver" : driver_error,
                     "; kregd serves CPU targets only"))));
    return none;
  }
  auto devices =
      std::unique_ptr<CudaDevices>(new CudaDevices(driver, absl::OkStatus()));
  CUresult r = driver->cuInit(0);
  if (r != cu::CUDA_SUCCESS) {
    devices->status_ = absl::UnavailableError(absl::StrCat(
        "no CUDA device: cuInit failed: ", DescribeCuResult(*driver, r),
        VisibleDevicesNote(), "; kregd serves CPU targets only"));
    return devices;
  }
  driver->cuDriverGetVersion(&devices->driver_version_);
  int n = 0;
  r = driver->cuDeviceGetCount(&n);
  if (r != cu::CUDA_SUCCESS || n <= 0) {
    devices->status_ = absl::UnavailableError(absl::StrCat(
        "no CUDA device: ",
        r != cu::CUDA_SUCCESS ? absl::StrCat("cuDeviceGetCount failed: ",
                                             DescribeCuResult(*driver, r))
                              : std::string("the driver reports 0 devices"),
        VisibleDevicesNote(), "; kregd serves CPU targets only"));
    return devices;
  }
  int usable = 0;
  for (int i = 0; i < n; ++i) {
    CudaDeviceInfo info;
    info.ordinal = i;
    std::string broken;
    r = driver->cuDeviceGet(&info.device, i);
    if (r == cu::CUDA_SUCCESS)
      r = driver->cuDeviceGetUuid(&info.uuid, info.device);
    if (r != cu::CUDA_SUCCESS) {
      broken =
          absl::StrCat("device ", i,
                       " could not be queried: ", DescribeCuResult(*driver, r));
    }
    info.uuid_text = cu::FormatCuUuid(info.uuid);
    char name[256] = {};
    if (driver->cuDeviceGetName(name, sizeof(name) - 1, info.device) ==
        cu::CUDA_SUCCESS) {
      info.name = name;
    }
    auto attr = [&](cu::CUdevice_attribute a) {
      int v = 0;
      return driver->cuDeviceGetAttribute(&v, a, info.device) ==
                     cu::CUDA_SUCCESS
                 ? v
                 : 0;
    };
    info.cc_major = attr(cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    info.cc_minor = attr(cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    info.vmm =
        attr(cu::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) != 0;
    info.posix_fd =
        attr(
            cu::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED) !=
        0;
    info.memory_pools =
        attr(cu::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED) != 0;
    info.memops64 =
        attr(cu::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS) != 0;
    cu::CUcontext ctx = nullptr;
    if (broken.empty()) {
      r = driver->cuDevicePrimaryCtxRetain(&ctx, info.device);
      if (r != cu::CUDA_SUCCESS) {
        ctx = nullptr;
        broken =
            absl::StrCat("retaining the primary context of ", info.uuid_text,
                         " failed: ", DescribeCuResult(*driver, r));
      }
    }
    if (broken.empty()) {
      ++usable;
      spdlog::info("CUDA device {}: {} ({}, sm_{}{}){}", i, info.uuid_text,
                   info.name, info.cc_major, info.cc_minor,
                   info.memory_pools ? "" : "; no memory pools");
    } else {
      spdlog::error("CUDA device {}: {}", i, broken);
    }
    devices->devices_.push_back(std::move(info));
    devices->contexts_.push_back(ctx);
    absl::MutexLock lock(&devices->mu_);
    devices->broken_.push_back(std::move(broken));
  }
  if (usable == 0) {
    absl::MutexLock lock(&devices->mu_);
    devices->status_ = absl::UnavailableError(absl::StrCat(
        "no usable CUDA device: ", absl::StrJoin(devices->broken_, "; ")));
  }
  return devices;
}

std::unique_ptr<CudaDevices> CudaDevices::OpenSystem() {
  std::string error;
  const cu::CudaDriver* driver = cu::LoadCudaDriver(&error);
  return Open(driver, error);
}

CudaDevices::~CudaDevices() {
  absl::MutexLock lock(&watch_mu_);
  for (size_t i = 0; i < probes_.size() && i < contexts_.size(); ++i) {
    if (probes_[i] == nullptr || contexts_[i] == nullptr) continue;
    if (driver_->cuCtxPushCurrent(contexts_[i]) == cu::CUDA_SUCCESS) {
      driver_->cuStreamDestroy(probes_[i]);
      cu::CUcontext popped;
      driver_->cuCtxPopCurrent(&popped);
    }
  }
  for (size_t i = 0; i < contexts_.size(); ++i) {
    if (contexts_[i] != nullptr) {
      driver_->cuDevicePrimaryCtxRelease(devices_[i].device);
    }
  }
}

std::string CudaDevices::Describe() const {
  if (devices_.empty()) return "none";
  std::vector<std::string> parts;
  for (const CudaDeviceInfo& d : devices_) {
    parts.push_back(absl::StrCat(d.uuid_text, " (ordinal ", d.ordinal, ", ",
                                 d.name.empty() ? "unnamed" : d.name, ", sm_",
                                 d.cc_major, d.cc_minor, ")"));
  }
  return absl::StrJoin(parts, ", ");
}

absl::StatusOr<int> CudaDevices::FindByUuid(absl::string_view uuid) const {
  if (uuid.size() != sizeof(cu::CUuuid)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a CUDA device UUID has 16 bytes, got ", uuid.size()));
  }
  if (devices_.empty()) return status_;
  for (const CudaDeviceInfo& d : devices_) {
    if (uuid == absl::string_view(d.uuid.bytes, sizeof(d.uuid.bytes))) {
      return d.ordinal;
    }
  }
  cu::CUuuid wanted;
  std::copy(uuid.begin(), uuid.end(), wanted.bytes);
  return absl::NotFoundError(absl::StrCat(
      "CUDA device ", cu::FormatCuUuid(wanted),
      " is not visible to kregd (check CUDA_VISIBLE_DEVICES of kregd and of "
      "the client); kregd's devices: ",
      Describe()));
}

absl::StatusOr<cu::CUcontext> CudaDevices::Context(int ordinal) const {
  KREG_RETURN_IF_ERROR(CheckUsable(ordinal));
  return contexts_[ordinal];
}

absl::Status CudaDevices::CheckUsable(int ordinal) const {
  if (ordinal < 0 || ordinal >= count()) {
    if (devices_.empty()) return status_;
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ordinal ", ordinal,
                     " is out of range: kregd has ", count(), " device(s)"));
  }
  absl::MutexLock lock(&mu_);
  if (!broken_[ordinal].empty()) {
    return absl::InternalError(broken_[ordinal]);
  }
  return absl::OkStatus();
}

absl::Status CudaDevices::Check(int ordinal, CUresult result,
                                absl::string_view what) {
  if (result == cu::CUDA_SUCCESS) return absl::OkStatus();
  if (driver_ == nullptr) return status_;
  if (!cu::IsStickyCuError(result) || ordinal < 0 || ordinal >= count()) {
    return CuStatus(*driver_, result, what);
  }
  const CudaDeviceInfo& d = devices_[ordinal];
  std::string why = absl::StrCat(
      "CUDA device ", d.uuid_text, " (kregd ordinal ", ordinal,
      ") hit a sticky error in ", what, ": ",
      DescribeCuResult(*driver_, result),
      ". Its context is corrupt, so kregd runs no more CUDA work on it; "
      "restart kregd to use it again");
  absl::MutexLock lock(&mu_);
  if (broken_[ordinal].empty()) {
    spdlog::error("{}", why);
    broken_[ordinal] = why;
    broken_result_.resize(broken_.size(), cu::CUDA_SUCCESS);
    broken_result_[ordinal] = result;
  }
  return absl::InternalError(broken_[ordinal]);
}

absl::Status CudaDevices::CheckStream(int ordinal, cu::CUstream stream) {
  KREG_RETURN_IF_ERROR(CheckUsable(ordinal));
  CUresult r = driver_->cuStreamQuery(stream);
  if (r == cu::CUDA_SUCCESS || r == cu::CUDA_ERROR_NOT_READY) {
    return absl::OkStatus();
  }
  return Check(ordinal, r, "the session stream (cuStreamQuery)");
}

void CudaDevices::Watch(int ordinal, cu::CUstream stream) {
  absl::MutexLock lock(&watch_mu_);
  watched_.emplace_back(ordinal, stream);
}

void CudaDevices::Unwatch(cu::CUstream stream) {
  absl::MutexLock lock(&watch_mu_);
  watched_.erase(std::remove_if(watched_.begin(), watched_.end(),
                                [&](const std::pair<int, cu::CUstream>& w) {
                                  return w.second == stream;
                                }),
                 watched_.end());
}

absl::Status CudaDevices::PollSticky(cu::CUresult* sticky, int* ordinal) {
  if (driver_ == nullptr) return absl::OkStatus();
  const cu::CudaDriver& d = *driver_;
  absl::MutexLock lock(&watch_mu_);
  probes_.resize(devices_.size(), nullptr);
  for (int i = 0; i < count(); ++i) {
    if (contexts_[i] == nullptr) continue;
    {
      absl::MutexLock broken_lock(&mu_);
      if (!broken_[i].empty() && i < static_cast<int>(broken_result_.size()) &&
          broken_result_[i] != cu::CUDA_SUCCESS) {
        if (sticky != nullptr) *sticky = broken_result_[i];
        if (ordinal != nullptr) *ordinal = i;
        return absl::InternalError(broken_[i]);
      }
      if (!broken_[i].empty()) continue;  // broken at start, not sticky
    }
    if (d.cuCtxPushCurrent(contexts_[i]) != cu::CUDA_SUCCESS) continue;
    auto query = [&](cu::CUstream s, const char* what) {
      CUresult r = d.cuStreamQuery(s);
      if (r == cu::CUDA_SUCCESS || r == cu::CUDA_ERROR_NOT_READY ||
          !cu::IsStickyCuError(r)) {
        return absl::OkStatus();
      }
      if (sticky != nullptr) *sticky = r;
      if (ordinal != nullptr) *ordinal = i;
      return Check(i, r, what);
    };
    absl::Status s;
    if (probes_[i] == nullptr &&
        d.cuStreamCreate(&probes_[i], cu::CU_STREAM_NON_BLOCKING) !=
            cu::CUDA_SUCCESS) {
      probes_[i] = nullptr;
    }
    if (probes_[i] != nullptr) {
      s = query(probes_[i],
                "the executor's sticky-error watch (cuStreamQuery)");
    }
    for (const auto& [on, stream] : watched_) {
      if (!s.ok()) break;
      if (on != i) continue;
      s = query(stream, "a session stream (cuStreamQuery by the watch)");
    }
    cu::CUcontext popped;
    d.cuCtxPopCurrent(&popped);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

CudaContextScope::CudaContextScope(const CudaDevices& devices, int ordinal) {
  absl::StatusOr<cu::CUcontext> ctx = devices.Context(ordinal);
  if (!ctx.ok()) {
    status_ = ctx.status();
    return;
  }
  driver_ = devices.driver();
  status_ =
      CuStatus(*driver_, driver_->cuCtxPushCurrent(*ctx), "cuCtxPushCurrent");
  pushed_ = status_.ok();
}

CudaContextScope::~CudaContextScope() {
  if (pushed_) {
    cu::CUcontext popped = nullptr;
    driver_->cuCtxPopCurrent(&popped);
  }
}

}  // namespace kreg
