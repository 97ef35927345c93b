// kregd's CUDA devices: the driver initialised once at daemon start, the
// primary context of every visible device retained (context creation costs
// ~150 ms, so it must not happen on a first launch), devices matched to
// clients by UUID, and sticky-error bookkeeping.
#ifndef KREGD_DAEMON_EXECUTOR_CUDA_CUDA_DEVICES_H_
#define KREGD_DAEMON_EXECUTOR_CUDA_CUDA_DEVICES_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/cuda_driver.h"

namespace kreg {

// `what` failed with `result`, as a Status: CUDA_SUCCESS is OK; out of memory
// RESOURCE_EXHAUSTED; invalid value/handle INVALID_ARGUMENT; not supported /
// not permitted FAILED_PRECONDITION; no device / driver unusable UNAVAILABLE;
// anything else INTERNAL. The message is "<what>: <DescribeCuResult>".
absl::Status CuStatus(const cu::CudaDriver& driver, cu::CUresult result,
                      absl::string_view what);

// One device as kregd sees it. Ordinals are kregd's (its CUDA_VISIBLE_DEVICES
// applies), so clients name devices by UUID.
struct CudaDeviceInfo {
  int ordinal = 0;
  cu::CUdevice device = 0;
  cu::CUuuid uuid{};
  std::string uuid_text;  // "GPU-xxxxxxxx-...", as nvidia-smi prints it
  std::string name;
  int cc_major = 0;
  int cc_minor = 0;
  bool vmm = false;           // cuMemCreate/cuMemMap family supported
  bool posix_fd = false;      // VMM handles exportable as POSIX fds
  bool memory_pools = false;  // cuMemAllocAsync supported
  bool memops64 = false;      // cuStreamWaitValue64/WriteValue64 (the doorbell)
};

// Owns the retained primary context of every visible device; releases them in
// its destructor (every stream, mapping and session using them must be gone
// by then). Thread-safe. The device list is fixed at Open; a device whose
// context raised a sticky error is marked broken and refused from then on.
class CudaDevices {
 public:
  // Calls cuInit and retains every device's primary context. Never fails:
  // without a driver (`driver` null; `driver_error` says why) or without a
  // device, the object has no devices and status() is UNAVAILABLE with the
  // reason. `driver` must outlive the object.
  static std::unique_ptr<CudaDevices> Open(const cu::CudaDriver* driver,
                                           absl::string_view driver_error);
  // Open() with the process's libcuda.so.1 (cu::LoadCudaDriver).
  static std::unique_ptr<CudaDevices> OpenSystem();

  ~CudaDevices();
  CudaDevices(const CudaDevices&) = delete;
  CudaDevices& operator=(const CudaDevices&) = delete;

  // OK when at least one device is usable for kregd, else UNAVAILABLE saying
  // why ("no CUDA driver: ...", "no CUDA device: ...").
  const absl::Status& status() const { return status_; }
  // Null without a driver.
  const cu::CudaDriver* driver() const { return driver_; }
  int driver_version() const { return driver_version_; }
  int count() const { return static_cast<int>(devices_.size()); }
  // 0 <= ordinal < count().
  const CudaDeviceInfo& info(int ordinal) const { return devices_[ordinal]; }
  // "GPU-... (ordinal 0, NVIDIA H200, sm_90), ..." or "none".
  std::string Describe() const;

  // kregd's ordinal of the device whose UUID is `uuid` (16 raw bytes, as
  // cuDeviceGetUuid returns them). INVALID_ARGUMENT if it is not 16 bytes;
  // NOT_FOUND naming the UUID and listing kregd's devices when the client's
  // GPU is not visible to kregd; UNAVAILABLE (status()) without devices.
  absl::StatusOr<int> FindByUuid(absl::string_view uuid) const;

  // The retained primary context of `ordinal`; CheckUsable's errors.
  absl::StatusOr<cu::CUcontext> Context(int ordinal) const;

  // INVALID_ARGUMENT for an ordinal out of range; INTERNAL with the sticky
  // error once the device is broken.
  absl::Status CheckUsable(int ordinal) const;

  // CuStatus(result) for work on `ordinal`. A sticky error marks the device
  // broken (logged once) and returns INTERNAL saying so.
  absl::Status Check(int ordinal, cu::CUresult result, absl::string_view what);

  // The sticky-error probe after a launch, without synchronising: queries
  // `stream` (cuStreamQuery, which returns a pending sticky error of the
  // context). Not-ready is fine. Check()'s errors.
  absl::Status CheckStream(int ordinal, cu::CUstream stream);

  // The sticky-error watch (an executor polls it from a thread of its own):
  // a kernel that faults after its handler returned leaves nobody waiting
  // on the host, so its executor learns of the fault only by asking.
  // Watch adds a session stream on `ordinal` to the streams PollSticky
  // queries; Unwatch removes it (before it is destroyed; returns once no
  // poll uses it).
  void Watch(int ordinal, cu::CUstream stream);
  void Unwatch(cu::CUstream stream);
  // Queries, without blocking (cuStreamQuery), every watched stream and a
  // private stream of every usable device. The first sticky error marks
  // its device broken (Check) and is returned (INTERNAL, naming the
  // device and the CUDA error); a device already broken (whoever found
  // it) is returned the same way; OK when no device is broken. `*sticky`
  // (if given) gets the CUresult and `*ordinal` the device of an error.
  absl::Status PollSticky(cu::CUresult* sticky = nullptr,
                          int* ordinal = nullptr);

 private:
  CudaDevices(const cu::CudaDriver* driver, absl::Status status);

  const cu::CudaDriver* const driver_;
  absl::Status status_;
  int driver_version_ = 0;
  std::vector<CudaDeviceInfo> devices_;
  std::vector<cu::CUcontext> contexts_;  // null where retaining failed
  mutable absl::Mutex mu_;
  // Per ordinal: empty, or why the device is unusable.
  std::vector<std::string> broken_ ABSL_GUARDED_BY(mu_);
  std::vector<cu::CUresult> broken_result_ ABSL_GUARDED_BY(mu_);
  // The watch; held while polling (never while mu_ is, never while calling
  // out but to the driver).
  absl::Mutex watch_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::vector<std::pair<int, cu::CUstream>> watched_ ABSL_GUARDED_BY(watch_mu_);
  std::vector<cu::CUstream> probes_ ABSL_GUARDED_BY(watch_mu_);  // by ordinal
};

// Makes `ordinal`'s primary context current on this thread for the scope's
// lifetime (cuCtxPushCurrent / cuCtxPopCurrent). Check status() first.
class CudaContextScope {
 public:
  CudaContextScope(const CudaDevices& devices, int ordinal);
  ~CudaContextScope();
  CudaContextScope(const CudaContextScope&) = delete;
  CudaContextScope& operator=(const CudaContextScope&) = delete;

  const absl::Status& status() const { return status_; }

 private:
  const cu::CudaDriver* driver_ = nullptr;
  bool pushed_ = false;
  absl::Status status_;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_CUDA_CUDA_DEVICES_H_
