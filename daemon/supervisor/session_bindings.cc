#include "daemon/supervisor/session_bindings.h"

namespace kreg {

bool SessionBindings::Add(uint64_t session_id, const PeerCred& peer,
                          const TargetKey& key, bool local, uint32_t generation,
                          bool pinned, uint32_t registered) {
  absl::MutexLock lock(&mu_);
  Session& s = sessions_[session_id];
  s.peer = peer;
  Bound& held = s.keys[key];
  held.key = key;
  const bool fresh = local && !held.local;
  held.local |= local;
  if (generation != 0) held.generation = generation;
  held.pinned = pinned;
  held.registered = registered;
  return fresh;
}

uint32_t SessionBindings::RegisteredBy(pid_t pid, const TargetKey& key) {
  absl::MutexLock lock(&mu_);
  uint32_t out = 0;
  for (const auto& [id, s] : sessions_) {
    if (s.peer.pid != pid) continue;
    auto it = s.keys.find(key);
    if (it != s.keys.end() && it->second.registered > out) {
      out = it->second.registered;
    }
  }
  return out;
}

uint32_t FollowedGeneration(const TargetEntry& entry,
                            const SessionBindings::Bound& held, uid_t uid) {
  if (held.pinned) return held.generation;
  if (held.registered == 0) return entry.generation;
  uint32_t at = held.registered;
  for (const Generation& g : entry.generations) {
    if (g.generation <= at) continue;
    if (g.by.uid != uid && g.by.uid != 0) break;
    at = g.generation;
  }
  return at;
}

std::map<uint64_t, std::pair<PeerCred, SessionBindings::Bound>>
SessionBindings::HoldersOf(const TargetKey& key) {
  absl::MutexLock lock(&mu_);
  std::map<uint64_t, std::pair<PeerCred, Bound>> out;
  for (const auto& [id, s] : sessions_) {
    auto it = s.keys.find(key);
    if (it != s.keys.end()) out.emplace(id, std::make_pair(s.peer, it->second));
  }
  return out;
}

void SessionBindings::SetGeneration(uint64_t session_id, const TargetKey& key,
                                    uint32_t generation) {
  absl::MutexLock lock(&mu_);
  auto s = sessions_.find(session_id);
  if (s == sessions_.end()) return;
  auto it = s->second.keys.find(key);
  if (it != s->second.keys.end()) it->second.generation = generation;
}

void SessionBindings::RemoveSession(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  sessions_.erase(session_id);
}

std::vector<PeerCred> SessionBindings::Holders(const TargetKey& key) {
  absl::MutexLock lock(&mu_);
  std::map<pid_t, PeerCred> by_pid;
  for (const auto& [id, s] : sessions_) {
    if (s.keys.count(key) != 0) by_pid[s.peer.pid] = s.peer;
  }
  std::vector<PeerCred> out;
  for (const auto& [pid, peer] : by_pid) out.push_back(peer);
  return out;
}

std::vector<SessionBindings::Bound> SessionBindings::LocalOf(pid_t pid) {
  absl::MutexLock lock(&mu_);
  std::vector<Bound> out;
  for (const auto& [id, s] : sessions_) {
    for (const auto& [key, b] : s.keys) {
      if (s.peer.pid == pid && b.local) out.push_back(b);
    }
  }
  return out;
}

std::map<uint64_t, std::vector<SessionBindings::Bound>>
SessionBindings::Snapshot() {
  absl::MutexLock lock(&mu_);
  std::map<uint64_t, std::vector<Bound>> out;
  for (const auto& [id, s] : sessions_) {
    std::vector<Bound>& v = out[id];
    for (const auto& [key, b] : s.keys) v.push_back(b);
  }
  return out;
}

size_t SessionBindings::LocalSessions() {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [id, s] : sessions_) {
    for (const auto& [key, b] : s.keys) {
      if (b.local) {
        ++n;
        break;
      }
    }
  }
  return n;
}

}  // namespace kreg
