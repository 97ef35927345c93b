// An in-memory fake of the CUDA driver (a cu::CudaDriver table whose entries
// act on this object), so daemon/executor/cuda, client/shim/cuda and the shim run
// their error paths and release bookkeeping without a GPU. One FakeCuda may
// exist at a time.
//
// GPU work is a sequence number: enqueueing (stream waits, records,
// stream-ordered alloc/free, EnqueueKernel) bumps it; the fake "GPU" has
// completed everything up to completed(). Events recorded after the last
// CompleteAll() are not ready until the next one.
#ifndef KREGD_TESTS_TESTING_FAKE_CUDA_H_
#define KREGD_TESTS_TESTING_FAKE_CUDA_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/cuda_driver.h"

namespace kreg::testing {

class FakeCuda {
 public:
  struct Device {
    std::string uuid;  // 16 raw bytes
    std::string name = "Fake H200";
    bool vmm = true;
    bool posix_fd = true;
    bool memory_pools = true;
    bool memops64 = true;  // CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS
  };

  FakeCuda();
  ~FakeCuda();
  FakeCuda(const FakeCuda&) = delete;
  FakeCuda& operator=(const FakeCuda&) = delete;

  const cu::CudaDriver* driver() const { return &table_; }

  // A 16-byte UUID whose bytes are all `b`.
  static std::string Uuid(unsigned char b) { return std::string(16, char(b)); }

  // --- Configuration ---------------------------------------------------
  std::vector<Device> devices;
  cu::CUresult init_result = cu::CUDA_SUCCESS;
  // What cuStreamQuery returns (e.g. a sticky error).
  cu::CUresult stream_query_result = cu::CUDA_SUCCESS;
  size_t granularity = 2 << 20;
  // Alignment of cuMemAllocAsync results.
  uint64_t pool_alignment = 256;
  // The next call of the driver function `fn` (cuda.h name) returns `r`.
  void FailNext(const std::string& fn, cu::CUresult r) { fail_next_[fn] = r; }

  // A real fd (a memfd) standing for an exported VMM allocation of `size`
  // bytes; `device_memory` false makes it host memory.
  int ExportAllocation(uint64_t size, bool device_memory = true);
  // An IPC handle of a cudaMalloc allocation of `size` bytes.
  cu::CUipcMemHandle IpcAllocation(uint64_t size);
  cu::CUipcEventHandle IpcEvent();

  // --- The client side: allocations of "this process" ------------------
  enum class Kind { kVmmPosixFd, kVmmNoExport, kCudaMalloc, kPool };
  // Device memory of `size` bytes on `ordinal`; returns its base address.
  uint64_t ClientAllocation(Kind kind, uint64_t size, int ordinal = 0);

  // --- GPU work --------------------------------------------------------
  void EnqueueKernel() { ++enqueued_; }
  void CompleteAll() { completed_ = enqueued_; }
  uint64_t enqueued() const { return enqueued_; }
  uint64_t completed() const { return completed_; }

  // --- Bookkeeping -----------------------------------------------------
  int retained_contexts = 0;
  int live_streams = 0;
  int live_events = 0;
  int live_handles = 0;       // imported VMM handles not released
  int live_reservations = 0;  // cuMemAddressReserve not freed
  int live_maps = 0;          // cuMemMap not unmapped
  int live_ipc_opens = 0;
  int live_pool_allocs = 0;
  int stream_syncs = 0;
  // Names of the driver functions called, in order.
  std::vector<std::string> calls;
  // Records of the client's IPC events (by event id) and waits on them.
  std::vector<std::string> event_log;
  // Stream memory operations, in order (cuStreamWaitValue64 and
  // cuStreamWriteValue64); writes also land in memory_ at once.
  struct MemOp {
    bool write = false;
    void* stream = nullptr;
    uint64_t addr = 0;
    uint64_t value = 0;
    void* context = nullptr;  // current when it was enqueued
  };
  // Offers cuCtxCreate/cuCtxDestroy (off: the table's are null, as with a
  // driver older than CUDA 12.5). Contexts made by it are counted.
  void EnableCtxCreate();
  int contexts_created = 0;
  int contexts_live = 0;
  // cuCtxGetId: unique per FakeCuda and context; bumping this makes every
  // context look destroyed and re-created at the same address.
  uint64_t context_epoch = 0;
  // Offers no cuCtxGetId (as a driver that lacks it).
  void DisableCtxGetId() { table_.cuCtxGetId = nullptr; }
  // This fake's number among those the process made (from 1).
  uint64_t serial() const { return serial_; }
  std::vector<MemOp> memops;
  std::map<uint64_t, uint64_t> memory_;  // 64-bit words written by memops
  // Contexts pushed on this thread and not popped.
  static int PushedDepth();

  // Internal: the fake behind the driver table.
  static FakeCuda* current();
  bool ShouldFail(const char* fn, cu::CUresult* r);

  struct Allocation {
    uint64_t size = 0;
    bool device_memory = true;
    uint64_t inode = 0;         // of an exported memfd
    bool posix_fd = true;       // exportable as a POSIX fd
    bool created_here = false;  // by cuMemCreate: maps as client memory
  };
  struct ClientAlloc {
    Kind kind;
    uint64_t size;
    int ordinal;
    uint64_t buffer_id;
  };
  struct EventFlags {
    unsigned int flags = 0;
  };
  struct Event {
    uint64_t recorded_at = 0;  // enqueued() when recorded
    std::string name;          // for event_log
  };

  std::map<int, Allocation> exported_;          // by fd
  std::map<uint64_t, Allocation> handles_;      // imported handles
  std::map<uint64_t, Allocation> ipc_allocs_;   // by IPC handle id
  std::map<uint64_t, std::string> ipc_events_;  // by IPC handle id
  std::map<uint64_t, uint64_t> reservations_;   // va -> size
  std::map<uint64_t, uint64_t> maps_;           // va -> size
  std::map<uint64_t, uint64_t> ipc_opened_;     // va -> size
  std::map<uint64_t, uint64_t> pool_;           // va -> size
  std::map<void*, Event> events_;
  std::map<void*, unsigned int> event_flags_;
  std::map<uint64_t, ClientAlloc> client_;  // base -> allocation
  const ClientAlloc* FindClient(uint64_t p, uint64_t* base) const;
  uint64_t next_id_ = 1;
  uint64_t next_va_ = 0x7f0000000000ull;
  uint64_t enqueued_ = 0;
  uint64_t completed_ = 0;

 private:
  std::map<std::string, cu::CUresult> fail_next_;
  uint64_t serial_ = 0;
  cu::CudaDriver table_{};
};

}  // namespace kreg::testing

#endif  // KREGD_TESTS_TESTING_FAKE_CUDA_H_
