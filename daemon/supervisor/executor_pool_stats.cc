// ExecutorPool: what the executors report through their status pages
// (per-target statistics, bound sessions), read as untrusted data.
#include <algorithm>

#include "daemon/base/status_page.h"
#include "daemon/supervisor/executor_group.h"
#include "daemon/supervisor/executor_pool.h"

namespace kreg {

void AddGroupStats(const ExecutorGroup& g,
                   std::map<GenerationId, TargetStatsRow>* out) {
  const StatusPage& page = g.exec->page();
  const size_t tokens = std::min<size_t>(g.resolved.size(), kStatsRows);
  for (size_t i = 0; i < tokens; ++i) {
    const StatsRow* row = page.stats_row(static_cast<uint32_t>(i + 1));
    if (row == nullptr) break;
    if (g.resolved[i] == nullptr) continue;  // not registered now
    TargetStats s = ReadUntrusted(*row);
    if (s.launches == 0 && s.count() == 0) continue;
    TargetStatsRow& dst = (*out)[GenerationId(*g.resolved[i])];
    if (dst.entry == nullptr) dst.entry = g.resolved[i];
    dst.stats.Add(s);
  }
}

uint32_t TokenIn(std::vector<EntryPtr>* resolved, EntryPtr entry) {
  const GenerationId id(*entry);
  for (size_t i = 0; i < resolved->size(); ++i) {
    const EntryPtr& e = (*resolved)[i];
    if (e != nullptr && GenerationId(*e) == id) {
      return static_cast<uint32_t>(i + 1);
    }
  }
  resolved->push_back(std::move(entry));
  return static_cast<uint32_t>(resolved->size());
}

std::vector<TargetStatsRow> ExecutorPool::TargetStatsSnapshot() const {
  absl::MutexLock lock(&mu_);
  std::map<GenerationId, TargetStatsRow> all = dead_stats_;
  for (const std::shared_ptr<Group>& g : unreaped_) AddGroupStats(*g, &all);
  std::vector<TargetStatsRow> out;
  out.reserve(all.size());
  for (auto& [id, row] : all) out.push_back(std::move(row));
  return out;
}

std::vector<BoundSession> ExecutorPool::Sessions() const {
  absl::MutexLock lock(&mu_);
  const uint64_t max_arena = options_.init.max_arena_bytes();
  std::vector<BoundSession> out;
  for (const std::shared_ptr<Group>& g : unreaped_) {
    if (g->dead) continue;
    for (uint32_t i = 0; i < g->used.size(); ++i) {
      if (!g->used[i]) continue;
      const ExecSlot* slot = g->exec->page().slot(i);
      BoundSession s;
      s.session_id = g->slot_info[i].session_id;
      s.peer = g->slot_info[i].peer;
      s.since_us = g->slot_info[i].since_us;
      s.executor_pid = g->exec->pid();
      s.executor = g->name;
      s.launches = slot->launches.load(std::memory_order_relaxed);
      s.arena_bytes = slot->arena_bytes.load(std::memory_order_relaxed);
      if (max_arena != 0) s.arena_bytes = std::min(s.arena_bytes, max_arena);
      s.states = slot->states.load(std::memory_order_relaxed);
      out.push_back(s);
    }
  }
  std::sort(out.begin(), out.end(),
            [](const BoundSession& a, const BoundSession& b) {
              return a.session_id < b.session_id;
            });
  return out;
}

}  // namespace kreg
