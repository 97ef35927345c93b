#include "daemon/supervisor/isolated_repointer.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "common/unique_fd.h"
#include "daemon/base/validate.h"
#include "daemon/supervisor/executor_group.h"
#include "spdlog/spdlog.h"

namespace kreg {

std::map<uint64_t, absl::Status> ExecutorPool::Repoint(
    const std::set<uint64_t>& sessions, const v1::ExecRepoint& repoint,
    const EntryPtr& entry, int module_fd, absl::Time deadline) {
  std::vector<std::pair<std::shared_ptr<Group>, std::vector<uint64_t>>> serve;
  std::vector<v1::ExecRepoint> frames;  // per executor: with its token
  {
    absl::MutexLock lock(&mu_);
    for (const std::shared_ptr<Group>& g : unreaped_) {
      if (g->dead) continue;
      std::vector<uint64_t> ids;
      for (uint32_t i = 0; i < g->used.size(); ++i) {
        if (g->used[i] && sessions.count(g->slot_info[i].session_id) != 0) {
          ids.push_back(g->slot_info[i].session_id);
        }
      }
      if (ids.empty()) continue;
      frames.push_back(repoint);
      // Each executor learns only its own sessions.
      frames.back().clear_content_sessions();
      for (uint64_t id : repoint.content_sessions()) {
        if (std::find(ids.begin(), ids.end(), id) != ids.end()) {
          frames.back().add_content_sessions(id);
        }
      }
      serve.emplace_back(g, std::move(ids));
      if (module_fd >= 0) frames.back().set_token(TokenIn(&g->resolved, entry));
    }
  }
  // Every executor gets the frame before any wait: they load concurrently.
  std::vector<absl::Status> answers;
  for (size_t i = 0; i < serve.size(); ++i) {
    answers.push_back(module_fd < 0 ? absl::OkStatus()
                                    : serve[i].first->exec->SendRepoint(
                                          frames[i], module_fd));
  }
  std::map<uint64_t, absl::Status> out;
  for (size_t i = 0; i < serve.size(); ++i) {
    if (answers[i].ok()) {
      answers[i] = serve[i].first->exec->AwaitRepointAck(repoint, deadline);
    }
    for (uint64_t id : serve[i].second) out[id] = answers[i];
  }
  return out;
}

std::vector<Repointer::Laggard> IsolatedRepointer::Repoint(
    const TargetEntry& entry, absl::Time deadline) {
  std::map<uint64_t, std::pair<PeerCred, SessionBindings::Bound>> holders =
      bindings_->HoldersOf(entry.key);
  std::set<uint64_t> ids;
  v1::ExecRepoint repoint;
  for (const auto& [id, held] : holders) {
    // A pinned session, and one holding another uid's generation for its
    // content (DESIGN §14 rule 1), stay where they are: no laggards.
    if (held.second.local || held.second.generation == entry.generation ||
        FollowedGeneration(entry, held.second, held.first.uid) !=
            entry.generation) {
      continue;
    }
    ids.insert(id);
    if (held.second.registered != 0) repoint.add_content_sessions(id);
  }
  if (ids.empty()) return {};
  repoint.set_target_name(entry.key.name);
  repoint.set_platform(PlatformName(entry.key.platform));
  repoint.set_generation(entry.generation);
  repoint.set_module_digest(entry.module_digest);
  repoint.set_func_name(entry.func_name);
  const std::string path = store_->PathOf(entry.module_digest);
  UniqueFd module(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  std::map<uint64_t, absl::Status> answers;
  if (module.ok()) {
    answers =
        pool_->Repoint(ids, repoint, std::make_shared<const TargetEntry>(entry),
                       module.get(), deadline);
  } else {
    spdlog::error("re-pointing {}: opening store copy {}: {}", Named(entry.key),
                  path, strerror(errno));
    for (uint64_t id : ids) {
      answers[id] = absl::UnavailableError(
          "kregd cannot open the module's store copy (see its log)");
    }
  }
  std::vector<Laggard> laggards;
  Late late{repoint, {}};
  for (uint64_t id : ids) {
    auto it = answers.find(id);
    if (it == answers.end() || it->second.ok()) {
      bindings_->SetGeneration(id, entry.key, entry.generation);
      continue;
    }
    if (absl::IsDeadlineExceeded(it->second)) late.sessions.insert(id);
    const auto& [peer, held] = holders[id];
    Laggard l;
    l.peer = peer;
    l.generation =
        held.generation != 0 ? held.generation : entry.generation - 1;
    if (!absl::IsDeadlineExceeded(it->second)) {
      l.why = std::string(it->second.message());
      spdlog::warn("re-pointing {} in session {} (pid {}): {}",
                   Named(entry.key), id, peer.pid, l.why);
    }
    laggards.push_back(std::move(l));
  }
  if (!late.sessions.empty()) {
    absl::MutexLock lock(&mu_);
    late_.push_back(std::move(late));
  }
  return laggards;
}

void IsolatedRepointer::Refresh() {
  std::vector<Late> late;
  {
    absl::MutexLock lock(&mu_);
    late.swap(late_);
  }
  std::vector<Late> still;
  for (Late& l : late) {
    const TargetKey key{l.repoint.target_name(),
                        *ParsePlatform(l.repoint.platform())};
    std::map<uint64_t, absl::Status> answers =
        pool_->Repoint(l.sessions, l.repoint, nullptr, -1, absl::Now());
    std::set<uint64_t> waiting;
    for (const auto& [id, status] : answers) {
      if (status.ok()) {
        bindings_->SetGeneration(id, key, l.repoint.generation());
      } else if (absl::IsDeadlineExceeded(status)) {
        waiting.insert(id);
      }
    }
    if (!waiting.empty()) still.push_back(Late{l.repoint, std::move(waiting)});
  }
  absl::MutexLock lock(&mu_);
  late_.insert(late_.end(), std::make_move_iterator(still.begin()),
               std::make_move_iterator(still.end()));
}

}  // namespace kreg
