#include "daemon/executor/repoint_table.h"

#include <utility>

namespace kreg {

bool RepointTable::Set(const TargetKey& key, uint32_t generation, void* handler,
                       uint32_t token, std::vector<uint64_t> content_sessions) {
  std::sort(content_sessions.begin(), content_sessions.end());
  absl::MutexLock lock(&mu_);
  Handler& h = handlers_[key];
  if (h.handler != nullptr && h.generation >= generation) return false;
  h = Handler{generation, handler, token, std::move(content_sessions)};
  epoch_.fetch_add(1, std::memory_order_release);
  return true;
}

std::optional<RepointTable::Handler> RepointTable::Find(
    const TargetKey& key) const {
  absl::MutexLock lock(&mu_);
  auto it = handlers_.find(key);
  if (it == handlers_.end()) return std::nullopt;
  return it->second;
}

}  // namespace kreg
