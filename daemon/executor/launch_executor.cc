#include "daemon/executor/launch_executor.h"

#include "daemon/executor/repoint_table.h"
#include "daemon/executor/session.h"

namespace kreg {

HandlerTable::HandlerTable(SessionBackend* backend)
    : backend_(backend), repoints_(backend->Repoints()) {}

absl::StatusOr<ResolvedHandler> HandlerTable::Lookup(const TargetKey& key,
                                                     uint32_t generation) {
  if (repoints_ != nullptr && repoints_->epoch() != seen_epoch_) {
    // Something was re-pointed since this session last looked: the
    // handlers it holds take their new generation (and its stats row) from
    // this launch on, except those it pinned.
    seen_epoch_ = repoints_->epoch();
    for (auto& [k, resolved] : handlers_) {
      if (k.second != 0) continue;
      if (std::optional<RepointTable::Handler> h = repoints_->Find(k.first)) {
        resolved = ResolvedHandler{h->handler, h->token};
      }
    }
  }
  auto it = handlers_.find({key, generation});
  if (it != handlers_.end()) return it->second;
  absl::StatusOr<ResolvedHandler> found = backend_->Lookup(key, generation);
  if (found.ok()) handlers_.emplace(std::make_pair(key, generation), *found);
  return found;
}

}  // namespace kreg
