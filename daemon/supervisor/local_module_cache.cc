#include "daemon/supervisor/local_module_cache.h"

#include <fcntl.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "daemon/base/files.h"
#include "daemon/store/module_store.h"

namespace kreg {

LocalModuleCache::LocalModuleCache(ModuleStore* store, uint64_t max_bytes,
                                   uint64_t max_module_bytes,
                                   bool tamper_for_test)
    : store_(store),
      max_bytes_(max_bytes),
      max_module_bytes_(max_module_bytes),
      tamper_for_test_(tamper_for_test) {}

absl::StatusOr<UniqueFd> LocalModuleCache::Open(const std::string& digest,
                                                uint64_t size,
                                                uint64_t session) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(digest);
  if (it == entries_.end()) {
    if (!MakeRoom(size)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "its module of ", size,
          " bytes does not fit in the memory kregd "
          "keeps for modules handed out for local execution: live sessions "
          "hold ",
          bytes_, " of its ", max_bytes_,
          " bytes (max_local_module_memory_bytes); run the target isolated, "
          "bind it again once other sessions have ended, or ask the operator "
          "to raise max_local_module_memory_bytes"));
    }
    KREG_ASSIGN_OR_RETURN(
        UniqueFd memfd,
        store_->SealedCopy(digest, max_module_bytes_, tamper_for_test_));
    it = entries_.emplace(digest, Entry{std::move(memfd), size}).first;
    bytes_ += size;
  }
  // Its own open file description, read-only: no holder shares a file
  // offset or status flags with another.
  const std::string path =
      absl::StrCat("/proc/self/fd/", it->second.memfd.get());
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.ok()) {
    return ErrnoError("cannot open the module memfd", path);
  }
  it->second.holders.insert(session);
  it->second.last_bind = ++binds_;
  return fd;
}

bool LocalModuleCache::MakeRoom(uint64_t size) {
  if (size > max_bytes_) return false;
  std::vector<std::map<std::string, Entry>::iterator> idle;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->second.holders.empty()) idle.push_back(it);
  }
  std::sort(idle.begin(), idle.end(), [](const auto& a, const auto& b) {
    return a->second.last_bind < b->second.last_bind;
  });
  for (auto it : idle) {
    if (bytes_ + size <= max_bytes_) break;
    bytes_ -= it->second.size;
    entries_.erase(it);
  }
  return bytes_ + size <= max_bytes_;
}

void LocalModuleCache::ReleaseSession(uint64_t session) {
  absl::MutexLock lock(&mu_);
  for (auto& [digest, e] : entries_) e.holders.erase(session);
}

uint64_t LocalModuleCache::bytes() {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace kreg
