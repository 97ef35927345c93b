#include "daemon/supervisor/session_bindings.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>

#include "common/unique_fd.h"

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

uint64_t ProcessStartTime(pid_t pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  UniqueFd fd(::open(path, O_RDONLY | O_CLOEXEC));
  if (!fd.ok()) return 0;
  char buf[1024];
  const ssize_t n = ::read(fd.get(), buf, sizeof(buf) - 1);
  if (n <= 0) return 0;
  buf[n] = '\0';
  // Fields after "(comm)", which may hold spaces and parentheses: field 3
  // (state) is the first.
  const char* p = strrchr(buf, ')');
  if (p == nullptr) return 0;
  ++p;
  for (int field = 3; field < 22; ++field) {
    p = strchr(p + 1, ' ');
    if (p == nullptr) return 0;
  }
  return strtoull(p + 1, nullptr, 10);
}

void SessionBindings::RecordRegistration(const PeerCred& peer,
                                         const TargetKey& key,
                                         uint32_t generation) {
  const uint64_t start = start_time_(peer.pid);
  if (start == 0 || generation == 0) return;  // it ended already
  std::vector<pid_t> pids;
  {
    absl::MutexLock lock(&mu_);
    Registration& r = registrations_[{peer.pid, key}];
    r = Registration{start, generation};  // its latest registration
    if (registrations_.size() <= kMaxRegistrations) return;
    for (const auto& [k, reg] : registrations_) pids.push_back(k.first);
  }
  // Full: forget the processes that ended (outside the lock: /proc reads).
  std::map<pid_t, uint64_t> alive;
  for (pid_t pid : pids) {
    if (alive.count(pid) == 0) alive[pid] = start_time_(pid);
  }
  absl::MutexLock lock(&mu_);
  for (auto it = registrations_.begin(); it != registrations_.end();) {
    auto a = alive.find(it->first.first);
    if (a != alive.end() && a->second != it->second.start_time) {
      it = registrations_.erase(it);
    } else {
      ++it;
    }
  }
  // Still full of live processes: drop this one (its connections still
  // say what it registered while they live).
  if (registrations_.size() > kMaxRegistrations) {
    registrations_.erase({peer.pid, key});
  }
}

uint32_t SessionBindings::RegisteredBy(pid_t pid, const TargetKey& key) {
  uint32_t out = 0;
  Registration recorded;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, s] : sessions_) {
      if (s.peer.pid != pid) continue;
      auto it = s.keys.find(key);
      if (it != s.keys.end() && it->second.registered > out) {
        out = it->second.registered;
      }
    }
    auto it = registrations_.find({pid, key});
    if (it != registrations_.end()) recorded = it->second;
  }
  // A record of an earlier process with the same pid counts for nothing.
  if (recorded.generation > out && start_time_(pid) == recorded.start_time) {
    out = recorded.generation;
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

std::vector<BindingOracle::GenerationHold> SessionBindings::GenerationHolds(
    const TargetKey& key) {
  absl::MutexLock lock(&mu_);
  std::vector<GenerationHold> out;
  for (const auto& [id, s] : sessions_) {
    auto it = s.keys.find(key);
    if (it == s.keys.end()) continue;
    out.push_back({s.peer, it->second.generation, it->second.pinned});
  }
  std::sort(out.begin(), out.end(),
            [](const GenerationHold& a, const GenerationHold& b) {
              return a.peer.pid < b.peer.pid;
            });
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
