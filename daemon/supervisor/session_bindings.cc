#include "daemon/supervisor/session_bindings.h"

namespace kreg {

bool SessionBindings::Add(uint64_t session_id, const PeerCred& peer,
                          const TargetKey& key, bool local) {
  absl::MutexLock lock(&mu_);
  Session& s = sessions_[session_id];
  s.peer = peer;
  bool& held = s.keys[key];
  const bool fresh = local && !held;
  held |= local;
  return fresh;
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

std::vector<PeerCred> SessionBindings::LocalHolders(const TargetKey& key) {
  absl::MutexLock lock(&mu_);
  std::map<pid_t, PeerCred> by_pid;
  for (const auto& [id, s] : sessions_) {
    auto it = s.keys.find(key);
    if (it != s.keys.end() && it->second) by_pid[s.peer.pid] = s.peer;
  }
  std::vector<PeerCred> out;
  for (const auto& [pid, peer] : by_pid) out.push_back(peer);
  return out;
}

std::map<uint64_t, std::vector<SessionBindings::Bound>>
SessionBindings::Snapshot() {
  absl::MutexLock lock(&mu_);
  std::map<uint64_t, std::vector<Bound>> out;
  for (const auto& [id, s] : sessions_) {
    std::vector<Bound>& v = out[id];
    for (const auto& [key, local] : s.keys) v.push_back(Bound{key, local});
  }
  return out;
}

size_t SessionBindings::LocalSessions() {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [id, s] : sessions_) {
    for (const auto& [key, local] : s.keys) {
      if (local) {
        ++n;
        break;
      }
    }
  }
  return n;
}

}  // namespace kreg
