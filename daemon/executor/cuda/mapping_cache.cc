#include "daemon/executor/cuda/mapping_cache.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kreg {

CudaMappingCache::CudaMappingCache(CudaMappingCacheOptions options,
                                   FenceSource* fences)
    : options_{std::max<size_t>(options.max_entries, 1)}, fences_(fences) {}

CudaMappingCache::~CudaMappingCache() { Close(); }

absl::StatusOr<std::shared_ptr<const CudaMapping>>
CudaMappingCache::GetOrImport(const CudaMappingKey& key,
                              const Importer& import) {
  Reap();
  if (absl::StatusOr<std::shared_ptr<const CudaMapping>> hit = Find(key);
      hit.ok()) {
    return hit;
  }
  KREG_ASSIGN_OR_RETURN(std::unique_ptr<CudaMapping> made, import());
  std::shared_ptr<const CudaMapping> fresh = std::move(made);
  if (fresh == nullptr || fresh->size() != key.size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the imported CUDA mapping has ", fresh ? fresh->size() : 0,
        " bytes, the client announced ", key.size));
  }
  std::shared_ptr<const CudaMapping> result;
  std::vector<std::shared_ptr<const CudaMapping>> evicted;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) {  // Another thread imported it meanwhile.
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      result = it->second.mapping;
    } else {
      lru_.push_front(key);
      entries_.emplace(key, Entry{fresh, lru_.begin()});
      result = fresh;
      while (entries_.size() > options_.max_entries) {
        auto victim = entries_.find(lru_.back());
        evicted.push_back(std::move(victim->second.mapping));
        entries_.erase(victim);
        lru_.pop_back();
      }
    }
  }
  Retire(std::move(evicted));
  return result;  // `fresh`, if unused, is released here (never queued).
}

absl::StatusOr<std::shared_ptr<const CudaMapping>> CudaMappingCache::Find(
    const CudaMappingKey& key) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "CUDA allocation at 0x", absl::Hex(key.base), " (", key.size,
        " bytes, generation ", key.generation,
        ") is not shared in this session (never sent, or evicted: at most ",
        options_.max_entries, " are kept); send its handle again"));
  }
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return it->second.mapping;
}

absl::StatusOr<CudaMappingCache::Resolved> CudaMappingCache::Resolve(
    const CudaMappingKey& key, uint64_t offset, uint64_t length) {
  KREG_ASSIGN_OR_RETURN(std::shared_ptr<const CudaMapping> m, Find(key));
  const uint64_t size = (m)->size();
  if (length > UINT64_MAX - offset) {
    return absl::OutOfRangeError(absl::StrCat("CUDA buffer at offset ", offset,
                                              " with ", length,
                                              " bytes overflows 64 bits"));
  }
  if (offset + length > size) {
    return absl::OutOfRangeError(
        absl::StrCat("CUDA buffer [", offset, ", ", offset + length,
                     ") ends past its allocation of ", size, " bytes"));
  }
  return Resolved{
      reinterpret_cast<void*>(static_cast<uintptr_t>((m)->base() + offset)),
      std::move(m)};
}

bool CudaMappingCache::Erase(const CudaMappingKey& key) {
  std::vector<std::shared_ptr<const CudaMapping>> evicted;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return false;
    evicted.push_back(std::move(it->second.mapping));
    lru_.erase(it->second.lru);
    entries_.erase(it);
  }
  Retire(std::move(evicted));
  return true;
}

void CudaMappingCache::Retire(
    std::vector<std::shared_ptr<const CudaMapping>> evicted) {
  if (evicted.empty()) return;
  std::vector<Retired> retired;
  for (std::shared_ptr<const CudaMapping>& m : evicted) {
    Retired r;
    r.held = m.use_count() > 1;
    if (!r.held && fences_ != nullptr) r.fence = fences_->Record(m->ordinal());
    r.mapping = std::move(m);
    if (r.held || r.fence != nullptr) retired.push_back(std::move(r));
    // Otherwise nothing was queued that uses it: `r` releases it here.
  }
  absl::MutexLock lock(&mu_);
  for (Retired& r : retired) retired_.push_back(std::move(r));
}

void CudaMappingCache::Reap() {
  std::vector<Retired> pending;
  {
    absl::MutexLock lock(&mu_);
    if (retired_.empty()) return;
    pending.swap(retired_);
  }
  std::vector<Retired> keep;
  for (Retired& r : pending) {
    if (r.mapping.use_count() > 1) {  // A launch still holds it.
      r.held = true;
      r.fence.reset();
      keep.push_back(std::move(r));
    } else if (r.held) {  // Released by its holder: fence its last use.
      r.held = false;
      if (fences_ != nullptr) r.fence = fences_->Record(r.mapping->ordinal());
      if (r.fence != nullptr) keep.push_back(std::move(r));
    } else if (r.fence != nullptr && !r.fence->Done()) {
      keep.push_back(std::move(r));
    }
  }
  {
    absl::MutexLock lock(&mu_);
    for (Retired& r : keep) retired_.push_back(std::move(r));
  }
  // `pending` now holds the mappings to release (moved-from entries aside).
}

void CudaMappingCache::Close() {
  std::vector<Retired> pending;
  std::vector<std::shared_ptr<const CudaMapping>> live;
  {
    absl::MutexLock lock(&mu_);
    pending.swap(retired_);
    for (auto& [key, entry] : entries_)
      live.push_back(std::move(entry.mapping));
    entries_.clear();
    lru_.clear();
  }
  for (Retired& r : pending) {
    if (r.fence != nullptr) r.fence->Wait();
  }
  if (fences_ != nullptr) {
    std::set<int> ordinals;
    for (const Retired& r : pending) {
      if (r.held) ordinals.insert(r.mapping->ordinal());
    }
    for (const auto& m : live) ordinals.insert(m->ordinal());
    for (int ordinal : ordinals) {
      if (std::unique_ptr<Fence> f = fences_->Record(ordinal)) f->Wait();
    }
  }
  // `pending` and `live` release everything here.
}

size_t CudaMappingCache::size() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

size_t CudaMappingCache::retired() const {
  absl::MutexLock lock(&mu_);
  return retired_.size();
}

}  // namespace kreg
