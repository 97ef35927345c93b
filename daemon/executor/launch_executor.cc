#include "daemon/executor/launch_executor.h"

#include "daemon/executor/repoint_table.h"
#include "daemon/executor/session_backend.h"

namespace kreg {

HandlerTable::HandlerTable(SessionBackend* backend, uint64_t session_id)
    : backend_(backend),
      session_id_(session_id),
      repoints_(backend->Repoints()) {}

absl::StatusOr<ResolvedHandler> HandlerTable::Lookup(const TargetKey& key,
                                                     uint32_t generation) {
  if (repoints_ != nullptr && repoints_->epoch() != seen_epoch_) {
    // Something was re-pointed since this session last looked: the
    // handlers it holds take their new generation (and its stats row) from
    // this launch on, except those it pinned.
    seen_epoch_ = repoints_->epoch();
    for (auto& [k, resolved] : handlers_) {
      if (k.second != 0) continue;
      std::optional<RepointTable::Handler> h = repoints_->Find(k.first);
      if (!h.has_value()) continue;
      // Held for its content: only its own uid's or root's generation,
      // which kregd names it for (DESIGN §14 rule 1).
      if (resolved.content && !h->Switches(session_id_)) continue;
      resolved = ResolvedHandler{h->handler, h->token, resolved.content};
    }
  }
  auto it = handlers_.find({key, generation});
  if (it != handlers_.end()) return it->second;
  absl::StatusOr<ResolvedHandler> found = backend_->Lookup(key, generation);
  if (found.ok()) handlers_.emplace(std::make_pair(key, generation), *found);
  return found;
}

}  // namespace kreg
