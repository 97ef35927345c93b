#include "daemon/executor/launch_executor.h"

#include "daemon/executor/session.h"

namespace kreg {

absl::StatusOr<void*> HandlerTable::Lookup(const TargetKey& key) {
  auto it = handlers_.find(key);
  if (it != handlers_.end()) return it->second;
  absl::StatusOr<void*> found = backend_->Lookup(key);
  if (found.ok()) handlers_.emplace(key, *found);
  return found;
}

}  // namespace kreg
