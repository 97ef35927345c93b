#include "daemon/executor/launch_executor.h"

#include "daemon/executor/repoint_table.h"
#include "daemon/executor/session.h"

namespace kreg {

HandlerTable::HandlerTable(SessionBackend* backend)
    : backend_(backend), repoints_(backend->Repoints()) {}

absl::StatusOr<void*> HandlerTable::Lookup(const TargetKey& key) {
  if (repoints_ != nullptr && repoints_->epoch() != seen_epoch_) {
    // Something was re-pointed since this session last looked: the
    // handlers it holds take their new generation from this launch on.
    seen_epoch_ = repoints_->epoch();
    for (auto& [k, handler] : handlers_) {
      if (std::optional<RepointTable::Handler> h = repoints_->Find(k)) {
        handler = h->handler;
      }
    }
  }
  auto it = handlers_.find(key);
  if (it != handlers_.end()) return it->second;
  absl::StatusOr<void*> found = backend_->Lookup(key);
  if (found.ok()) handlers_.emplace(key, *found);
  return found;
}

}  // namespace kreg
