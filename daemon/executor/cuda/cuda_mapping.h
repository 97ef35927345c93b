// Client GPU memory mapped into kregd: imported CUDA VMM allocations
// (POSIX fds from cuMemExportToShareableHandle) and legacy CUDA IPC memory
// (cudaIpcGetMemHandle of cudaMalloc memory). Each object owns its mapping
// and releases it in its destructor with the device's context current; the
// caller must make sure no queued GPU work still uses it (CudaMappingCache
// defers releases behind a fence).
#ifndef KREGD_DAEMON_EXECUTOR_CUDA_CUDA_MAPPING_H_
#define KREGD_DAEMON_EXECUTOR_CUDA_CUDA_MAPPING_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "daemon/executor/cuda/cuda_devices.h"

namespace kreg {

// A range of device memory kregd can pass to handlers. Immutable.
class CudaMapping {
 public:
  virtual ~CudaMapping() = default;
  // kregd's device address of the client's allocation base.
  virtual cu::CUdeviceptr base() const = 0;
  virtual uint64_t size() const = 0;
  // kregd's ordinal of the device the memory is mapped for.
  virtual int ordinal() const = 0;
};

// An imported VMM allocation: cuMemImportFromShareableHandle +
// cuMemAddressReserve + cuMemMap + cuMemSetAccess (read-write on `ordinal`).
// The destructor unmaps, frees the reservation and releases the handle.
class VmmImport final : public CudaMapping {
 public:
  // Imports `fd` (a POSIX-fd shareable handle of an allocation the client
  // maps at offset 0 with `size` bytes, its whole mapping) and maps it on
  // `ordinal`. The fd is closed when this returns (the import keeps its own
  // reference). INVALID_ARGUMENT: size 0, fd not a CUDA allocation, not
  // device memory, size not a multiple of the allocation granularity or
  // larger than the allocation; FAILED_PRECONDITION: device without VMM or
  // POSIX-fd handles; RESOURCE_EXHAUSTED: out of address space; INTERNAL
  // otherwise; CudaDevices::Check's sticky errors. `devices` must outlive it.
  static absl::StatusOr<std::unique_ptr<VmmImport>> Import(CudaDevices* devices,
                                                           int ordinal,
                                                           UniqueFd fd,
                                                           uint64_t size);
  ~VmmImport() override;

  cu::CUdeviceptr base() const override { return base_; }
  uint64_t size() const override { return size_; }
  int ordinal() const override { return ordinal_; }

 private:
  VmmImport(CudaDevices* devices, int ordinal, uint64_t size)
      : devices_(devices), ordinal_(ordinal), size_(size) {}

  CudaDevices* const devices_;
  const int ordinal_;
  const uint64_t size_;
  cu::CUmemGenericAllocationHandle handle_ = 0;
  bool imported_ = false;
  cu::CUdeviceptr base_ = 0;  // reservation start, 0 if none
  bool mapped_ = false;
  bool complete_ = false;  // Import succeeded (logged as mapped)
};

// Legacy CUDA IPC memory opened with cuIpcOpenMemHandle (lazy peer access);
// the destructor closes it (cuIpcCloseMemHandle).
class IpcMemOpen final : public CudaMapping {
 public:
  // Opens `handle` on `ordinal`; `size` is the client's allocation size.
  // INVALID_ARGUMENT: size 0, a bad handle, or size larger than the range
  // the handle maps; CudaDevices::Check's errors otherwise.
  static absl::StatusOr<std::unique_ptr<IpcMemOpen>> Open(
      CudaDevices* devices, int ordinal, const cu::CUipcMemHandle& handle,
      uint64_t size);
  ~IpcMemOpen() override;

  cu::CUdeviceptr base() const override { return base_; }
  uint64_t size() const override { return size_; }
  int ordinal() const override { return ordinal_; }

 private:
  IpcMemOpen(CudaDevices* devices, int ordinal, cu::CUdeviceptr base,
             uint64_t size)
      : devices_(devices), ordinal_(ordinal), size_(size), base_(base) {}

  CudaDevices* const devices_;
  const int ordinal_;
  const uint64_t size_;
  const cu::CUdeviceptr base_;
  bool complete_ = false;  // Open succeeded (logged as mapped)
};

// A client's interprocess event (cuIpcOpenEventHandle) for stream ordering
// across the two processes. Thread-compatible.
class IpcEventOpen {
 public:
  // INVALID_ARGUMENT for a bad handle; CudaDevices::Check's errors.
  static absl::StatusOr<std::unique_ptr<IpcEventOpen>> Open(
      CudaDevices* devices, int ordinal, const cu::CUipcEventHandle& handle);
  ~IpcEventOpen();
  IpcEventOpen(const IpcEventOpen&) = delete;
  IpcEventOpen& operator=(const IpcEventOpen&) = delete;

  // Makes `stream` wait for the event's latest record (cuStreamWaitEvent):
  // work queued on `stream` afterwards starts after the client's work.
  absl::Status WaitOn(cu::CUstream stream);
  // Records the event on `stream` (cuEventRecord) for the client to wait on.
  absl::Status RecordOn(cu::CUstream stream);

  int ordinal() const { return ordinal_; }

 private:
  IpcEventOpen(CudaDevices* devices, int ordinal, cu::CUevent event)
      : devices_(devices), ordinal_(ordinal), event_(event) {}

  CudaDevices* const devices_;
  const int ordinal_;
  const cu::CUevent event_;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_CUDA_CUDA_MAPPING_H_
