// The content-addressed compile cache (DESIGN §13, docs/operator-guide.md
// "The compile service"): <dir>/<key hex>.so, one file per cache key,
// bounded in bytes, least recently used evicted first (a hit refreshes the
// file's mtime). Thread-safe; one mutex guards the directory.
#ifndef KREGD_DAEMON_COMPILE_SERVICE_COMPILE_CACHE_H_
#define KREGD_DAEMON_COMPILE_SERVICE_COMPILE_CACHE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace kreg {

struct CompileCacheUsage {
  uint64_t files = 0;
  uint64_t bytes = 0;
};

struct CompileCacheTrim {
  CompileCacheUsage removed;
  CompileCacheUsage kept;
};

class CompileCache {
 public:
  // `max_bytes`: the size bound Put trims to (0: unbounded).
  CompileCache(std::string dir, uint64_t max_bytes);
  CompileCache(const CompileCache&) = delete;
  CompileCache& operator=(const CompileCache&) = delete;

  // Creates the directory (0700). INTERNAL with the errno text.
  absl::Status Init();
  // The module cached under `key`, refreshing its use; nullopt when absent.
  std::optional<std::string> Get(const std::string& key);
  // Stores `module` under `key` (temp file, fsync, rename), then evicts the
  // least recently used entries while the cache exceeds max_bytes.
  absl::Status Put(const std::string& key, const std::string& module);
  // Evicts least recently used entries until at most `target_bytes` remain
  // (kregctl gc: half of max_bytes).
  CompileCacheTrim TrimTo(uint64_t target_bytes);
  CompileCacheUsage Usage();
  uint64_t max_bytes() const { return max_bytes_; }

 private:
  std::string PathOf(const std::string& key) const;
  CompileCacheTrim TrimLocked(uint64_t target_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string dir_;
  const uint64_t max_bytes_;
  absl::Mutex mu_;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_COMPILE_SERVICE_COMPILE_CACHE_H_
