// The per-session cache of allocations shared with kregd and the export
// bookkeeping of forwarded CUDA calls (cuda_forward.cc). Internal to
// //client/shim.
#ifndef KREGD_CLIENT_SHIM_CUDA_CONN_STATE_H_
#define KREGD_CLIENT_SHIM_CUDA_CONN_STATE_H_

#include <sys/types.h>

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "client/shim/cuda/cuda_export.h"
#include "client/shim/cuda/doorbell.h"
#include "client/shim/cuda/ipc_events.h"
#include "client/shim/cuda/staging_buffer.h"
#include "client/shim/cuda_session.h"
#include "common/cuda_driver.h"
#include "common/mps_control.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "kreg/v1/session.pb.h"

namespace kreg {
namespace shim {

namespace cc = ::kreg::cuda_client;

using Key = std::tuple<std::string, uint64_t, uint64_t, uint64_t>;

Key KeyOf(const cc::AllocationId& id);

void FillRef(const cc::AllocationId& id, v1::CudaMappingRef* ref);

// Whether CUDA ring launches are asynchronous, from KREG_ASYNC_LAUNCH
// (`env_value`, null: unset) and the MPS probe of this process's pipe
// directory: "force" yes; "1" only under MPS (without it, an asynchronous
// launch measured 6.6x-7.9x in-process on the H200, so "1" is
// refused and *warning says why and what to do); anything else no.
bool ChooseAsyncLaunch(const char* env_value, const MpsControl& mps,
                       std::string* warning);

// One device buffer of the call.
struct Buf {
  void* data = nullptr;
  uint64_t bytes = 0;
  bool is_arg = false;
  // The buffer's shape, as XLA gave it (dims borrowed for the call).
  int32_t dtype = 0;
  uint32_t rank = 0;
  const int64_t* dims = nullptr;
  cc::AllocationId id;  // when bytes > 0
  uint64_t offset = 0;  // in id's mapping
  // Staged through the staging buffer at this offset (kNeedsStaging).
  bool staged = false;
  uint64_t stage_offset = 0;
  bool copy_in = false;   // first staged occurrence of an input
  bool copy_out = false;  // first staged occurrence of an output
};

class CudaConnState {
 public:
  explicit CudaConnState(const cu::CudaDriver* d);

  ~CudaConnState();

  struct Entry {
    cc::AllocationId id;
    cc::ExportKind kind = cc::ExportKind::kVmmFd;
    cc::RetainedAllocation retained;  // kVmmFd: kept while kregd maps it
    std::list<Key>::iterator lru;
  };

  struct Events {
    std::map<std::string, std::unique_ptr<cc::IpcEventPair>> pairs;
    std::map<std::string, bool> sent;
  };

  // The doorbell of one device: set up with kregd on the first launch,
  // or `failed` (then events are used, with a trace line).
  struct Bell {
    std::unique_ptr<cc::Doorbell> bell;
    bool failed = false;
  };

  const cu::CudaDriver* d_;
  const pid_t pid_;
  const bool want_doorbell_;
  // KREG_ASYNC_LAUNCH=1 under MPS, or =force: steady-state launches on the
  // launch ring return before kregd acknowledges them; an error is reported
  // on the session's next call (DESIGN §9). ChooseAsyncLaunch decides.
  const bool want_async_;
  std::map<std::string, Bell> bells_;  // by device uuid
  std::map<Key, Entry> entries_;
  std::list<Key> lru_;  // front: most recent
  std::vector<cc::AllocationId> pending_release_;
  Events events_;
  // Staging buffers by device uuid.
  std::map<std::string, std::unique_ptr<cc::StagingArena>> arenas_;

  cc::StagingArena* Arena(const std::string& uuid, int ordinal,
                          cu::CUcontext ctx);

  // Drops the entry of `key`, if any, telling kregd to release it.
  void DropKey(const Key& key);

  Entry* Find(const Key& k);

  void Drop(std::map<Key, Entry>::iterator it, bool tell_kregd);

  void Insert(Entry e);

  // Evicts least recently used entries not in `keep` down to `limit`.
  void Trim(size_t limit, const std::vector<Key>& keep);

  // Drops up to kSweepPerLaunch least recently used entries whose
  // allocation is gone (a different or no BUFFER_ID at its base).
  void Sweep(const std::vector<Key>& keep);

  void Clear();
};

// What one attempt of a launch sends and keeps.
struct Plan {
  std::vector<v1::CudaShare> shares;
  std::vector<UniqueFd> fds;  // in the order of vmm_fd shares
  std::vector<CudaConnState::Entry> new_entries;
};

// Shares (or finds cached) the allocation of `b`; marks it staged when it
// cannot be shared. `used`: every allocation of the call (kept in the
// cache); `mapped`: those kregd maps (what its per-session limit counts).
ClientStatus PlanBuffer(CudaConnState* st, Buf* b, Plan* plan,
                        std::vector<Key>* used, std::vector<Key>* mapped);

}  // namespace shim
}  // namespace kreg

#endif  // KREGD_CLIENT_SHIM_CUDA_CONN_STATE_H_
