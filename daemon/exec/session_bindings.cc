#include "daemon/exec/session_bindings.h"

namespace kreg {

void SessionBindings::Add(uint64_t session_id, pid_t pid,
                          const TargetKey& key) {
  absl::MutexLock lock(&mu_);
  Session& s = sessions_[session_id];
  s.pid = pid;
  s.keys.insert(key);
}

void SessionBindings::RemoveSession(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  sessions_.erase(session_id);
}

std::vector<pid_t> SessionBindings::PidsBinding(const TargetKey& key) {
  absl::MutexLock lock(&mu_);
  std::set<pid_t> pids;
  for (const auto& [id, s] : sessions_) {
    if (s.keys.count(key) != 0) pids.insert(s.pid);
  }
  return std::vector<pid_t>(pids.begin(), pids.end());
}

std::map<uint64_t, std::vector<TargetKey>> SessionBindings::Snapshot() {
  absl::MutexLock lock(&mu_);
  std::map<uint64_t, std::vector<TargetKey>> out;
  for (const auto& [id, s] : sessions_) {
    out[id] = std::vector<TargetKey>(s.keys.begin(), s.keys.end());
  }
  return out;
}

}  // namespace kreg
