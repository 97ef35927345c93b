// The sealed module memfds kregd hands out for local execution (DESIGN §11).
#ifndef KREGD_DAEMON_SUPERVISOR_LOCAL_MODULE_CACHE_H_
#define KREGD_DAEMON_SUPERVISOR_LOCAL_MODULE_CACHE_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"

namespace kreg {

class ModuleStore;

// One sealed memfd per module digest, made by ModuleStore::SealedCopy (copy,
// re-hash, seal) on the first local bind of the module and shared by every
// later bind of it, on any session: N binds cost one copy, one hash and one
// module's shared memory. Each bind gets its own read-only open file
// description of the memfd. The memfds held are bounded by `max_bytes`
// (max_local_module_memory_bytes): to make room, those no live session
// holds are dropped, least recently bound first. Thread-safe; a first bind
// copies and hashes with the lock held, so binds wait for each other.
class LocalModuleCache {
 public:
  // `store` must outlive the cache. `max_module_bytes` and `tamper_for_test`
  // go to SealedCopy.
  LocalModuleCache(ModuleStore* store, uint64_t max_bytes,
                   uint64_t max_module_bytes, bool tamper_for_test = false);
  LocalModuleCache(const LocalModuleCache&) = delete;
  LocalModuleCache& operator=(const LocalModuleCache&) = delete;

  // A read-only descriptor of the sealed memfd of `digest` (a module of
  // `size` bytes), which `session` holds from now until ReleaseSession.
  // RESOURCE_EXHAUSTED naming max_local_module_memory_bytes when a new memfd
  // of `size` bytes does not fit beside those live sessions hold;
  // SealedCopy's errors otherwise.
  absl::StatusOr<UniqueFd> Open(const std::string& digest, uint64_t size,
                                uint64_t session);
  // `session` ended: the memfds it held may be dropped to make room.
  void ReleaseSession(uint64_t session);
  // Bytes of the memfds held now.
  uint64_t bytes();

 private:
  struct Entry {
    UniqueFd memfd;
    uint64_t size = 0;
    std::set<uint64_t> holders;  // session ids
    uint64_t last_bind = 0;      // binds_ at the entry's latest bind
  };
  // Drops entries no session holds, least recently bound first, until
  // `size` more bytes fit; false when they cannot.
  bool MakeRoom(uint64_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ModuleStore* const store_;
  const uint64_t max_bytes_;
  const uint64_t max_module_bytes_;
  const bool tamper_for_test_;
  absl::Mutex mu_;
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);  // by digest
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t binds_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_SUPERVISOR_LOCAL_MODULE_CACHE_H_
