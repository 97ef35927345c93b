// The client GPU memory one session has shared with kregd (DESIGN §3).
#ifndef KREGD_DAEMON_EXECUTOR_CUDA_MAPPING_CACHE_H_
#define KREGD_DAEMON_EXECUTOR_CUDA_MAPPING_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/executor/cuda/cuda_mapping.h"
#include "daemon/executor/cuda/fence.h"

namespace kreg {

// Identity of one client allocation: the device (UUID, 16 raw bytes), the
// client's base address and size of the mapping, and a generation the client
// guarantees to differ whenever the same (base, size) names a new allocation
// (CU_POINTER_ATTRIBUTE_BUFFER_ID), so a reused virtual address can never
// alias a cached mapping.
struct CudaMappingKey {
  std::string device_uuid;
  uint64_t base = 0;
  uint64_t size = 0;
  uint64_t generation = 0;

  bool operator<(const CudaMappingKey& o) const {
    return std::tie(device_uuid, base, size, generation) <
           std::tie(o.device_uuid, o.base, o.size, o.generation);
  }
  bool operator==(const CudaMappingKey& o) const {
    return device_uuid == o.device_uuid && base == o.base && size == o.size &&
           generation == o.generation;
  }
};

struct CudaMappingCacheOptions {
  // Mappings kept per session; the least recently used beyond it is evicted.
  size_t max_entries = 256;
};

// Owns the mappings of one session: a bounded LRU from CudaMappingKey to an
// imported mapping. An evicted or erased mapping is released only after the
// GPU work queued before its eviction has completed (a fence from
// `fences`); Close() (and the destructor) waits for those fences and
// releases everything. Lookups hand out shared ownership, so a mapping is
// never destroyed under a caller. Thread-safe; the mutex is never held while
// importing, recording fences or releasing.
class CudaMappingCache {
 public:
  using Importer =
      std::function<absl::StatusOr<std::unique_ptr<CudaMapping>>()>;

  // `fences` may be null (evicted mappings are then released at once); it
  // must outlive the cache.
  CudaMappingCache(CudaMappingCacheOptions options, FenceSource* fences);
  ~CudaMappingCache();
  CudaMappingCache(const CudaMappingCache&) = delete;
  CudaMappingCache& operator=(const CudaMappingCache&) = delete;

  // The mapping cached under `key`, or the one `import` creates (called
  // only on a miss, without the lock). A mapping whose size differs from
  // key.size is refused (INVALID_ARGUMENT). import's errors verbatim.
  absl::StatusOr<std::shared_ptr<const CudaMapping>> GetOrImport(
      const CudaMappingKey& key, const Importer& import);

  // The cached mapping (marked most recently used). NOT_FOUND if this session
  // has not shared it or it was evicted: the client must send it again.
  absl::StatusOr<std::shared_ptr<const CudaMapping>> Find(
      const CudaMappingKey& key);

  // A buffer inside a cached mapping. `data` is valid while `mapping` is
  // held.
  struct Resolved {
    void* data = nullptr;
    std::shared_ptr<const CudaMapping> mapping;
  };

  // kregd's device address of [offset, offset + length) of the allocation
  // `key`: NOT_FOUND as Find; OUT_OF_RANGE, quoting the values, if
  // offset + length overflows or ends past the mapping. A zero-length range
  // at or before the end is valid.
  //
  // A launch must hold every Resolved until its GPU work is queued, and must
  // not reference more than max_entries allocations (it could evict its own
  // buffers otherwise); a mapping still held when evicted is released only
  // after a fence recorded once the holder let go.
  absl::StatusOr<Resolved> Resolve(const CudaMappingKey& key, uint64_t offset,
                                   uint64_t length);

  size_t max_entries() const { return options_.max_entries; }

  // Drops `key` (released behind a fence); false if it was not cached.
  bool Erase(const CudaMappingKey& key);

  // Releases retired mappings whose fence is done. Non-blocking.
  void Reap();

  // Waits for every retired mapping's fence and releases all mappings.
  // Further GetOrImport calls import again. Session close only.
  void Close();

  size_t size() const;
  size_t retired() const;

 private:
  struct Entry {
    std::shared_ptr<const CudaMapping> mapping;
    std::list<CudaMappingKey>::iterator lru;  // position in lru_
  };
  struct Retired {
    std::shared_ptr<const CudaMapping> mapping;
    std::unique_ptr<Fence> fence;  // null: nothing to wait for
    bool held = false;  // still used by a launch: fence again once released
  };

  // Moves `evicted` to retired_ behind fresh fences (lock not held).
  void Retire(std::vector<std::shared_ptr<const CudaMapping>> evicted);

  const CudaMappingCacheOptions options_;
  FenceSource* const fences_;
  mutable absl::Mutex mu_;
  std::map<CudaMappingKey, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::list<CudaMappingKey> lru_ ABSL_GUARDED_BY(mu_);  // front: most recent
  std::vector<Retired> retired_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_CUDA_MAPPING_CACHE_H_
