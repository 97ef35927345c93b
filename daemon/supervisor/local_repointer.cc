#include "daemon/supervisor/local_repointer.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/wire.h"
#include "daemon/base/served_session.h"
#include "daemon/base/validate.h"
#include "daemon/supervisor/local_module_cache.h"
#include "daemon/supervisor/session_bindings.h"
#include "spdlog/spdlog.h"

namespace kreg {

namespace {

std::unique_ptr<UidAccount> OwnAccount(UidAccount* given, size_t limit) {
  if (given != nullptr) return nullptr;
  UidLimits limits{};
  limits[static_cast<size_t>(UidResource::kWatchConnections)] = limit;
  return std::make_unique<UidAccount>(limits);
}

}  // namespace

LocalRepointer::LocalRepointer(SessionBindings* bindings,
                               LocalModuleCache* modules,
                               size_t max_watches_per_uid, UidAccount* account)
    : bindings_(bindings),
      modules_(modules),
      own_account_(OwnAccount(account, max_watches_per_uid)),
      account_(account != nullptr ? account : own_account_.get()) {}

absl::Status LocalRepointer::Reserve(uint64_t session, const PeerCred& peer) {
  absl::MutexLock lock(&mu_);
  for (const auto& [id, w] : watches_) {
    if (w->peer.pid == peer.pid) {
      return absl::FailedPreconditionError(absl::StrCat(
          "kregd refused a watch connection of pid ", peer.pid,
          ": that process has one already (session ", id,
          "); the shim opens one per process, on its first replaceable "
          "local bind. Closing this connection"));
    }
  }
  absl::StatusOr<UidAccount::Charge> charge =
      account_->Take(peer.uid, UidResource::kWatchConnections, 1);
  if (!charge.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "kregd refused a watch connection of pid ", peer.pid, " (",
        UserName(peer.uid),
        "; one per process holding a replaceable target "
        "locally): ",
        charge.status().message(),
        "; or end some of those processes, or run the target isolated. "
        "Closing this connection"));
  }
  auto w = std::make_shared<Watch>();
  w->peer = peer;
  w->charge = *std::move(charge);
  watches_[session] = std::move(w);
  return absl::OkStatus();
}

void LocalRepointer::Activate(
    uint64_t session, int sock,
    const std::function<EntryPtr(const TargetKey&)>& current,
    absl::Time deadline) {
  std::shared_ptr<Watch> w;
  {
    absl::MutexLock lock(&mu_);
    auto it = watches_.find(session);
    if (it == watches_.end()) return;
    it->second->sock.reset(::fcntl(sock, F_DUPFD_CLOEXEC, 0));
    w = it->second;
  }
  // After the socket is set: a replacement committed before it is seen by
  // `current`, a later one's Repoint sends to this socket itself.
  for (const SessionBindings::Bound& held : bindings_->LocalOf(w->peer.pid)) {
    const EntryPtr e = current(held.key);
    // A pinned binding gets it too: the shim acks its pin, which counts.
    // One held for its content only when it follows (DESIGN §14 rule 1).
    if (e == nullptr || e->generation <= held.generation) continue;
    if (!held.pinned &&
        FollowedGeneration(*e, held, w->peer.uid) != e->generation) {
      continue;
    }
    if (absl::Status sent = Notify(session, w, *e, deadline); !sent.ok()) {
      spdlog::warn("re-pointing \"{}\" ({}) to generation {}: pid {}: {}",
                   e->key.name, PlatformName(e->key.platform), e->generation,
                   w->peer.pid, sent.ToString());
      return;
    }
  }
}

void LocalRepointer::Acked(uint64_t session, const v1::RepointAck& ack) {
  absl::StatusOr<Platform> platform = ParsePlatform(ack.platform());
  if (!platform.ok()) return;
  const TargetKey key{ack.target_name(), *platform};
  const absl::Status status = FromWireStatus(ack.status());
  absl::MutexLock lock(&mu_);
  auto it = watches_.find(session);
  if (it == watches_.end()) return;
  const pid_t pid = it->second->peer.pid;
  if (status.ok()) {
    // What `kregctl show` says this process runs.
    for (const auto& [id, held] : bindings_->HoldersOf(key)) {
      if (held.first.pid == pid && held.second.local) {
        bindings_->SetGeneration(id, key, ack.generation());
      }
    }
  }
  for (Wait* wait : waits_) {
    // A pinned binding stays at its generation (docs/replace.md §7).
    if (!(wait->key == key) ||
        (wait->generation != ack.generation() && ack.pinned() == 0)) {
      continue;
    }
    auto a = wait->acks.find(pid);
    if (a != wait->acks.end() && a->second == nullptr) {
      a->second = std::make_unique<absl::Status>(status);
    }
  }
  cv_.SignalAll();
}

void LocalRepointer::Detach(uint64_t session) {
  std::shared_ptr<Watch> w;
  {
    absl::MutexLock lock(&mu_);
    auto it = watches_.find(session);
    if (it == watches_.end()) return;
    w = std::move(it->second);
    watches_.erase(it);
    for (Wait* wait : waits_) {
      auto a = wait->acks.find(w->peer.pid);
      if (a != wait->acks.end() && a->second == nullptr) {
        a->second = std::make_unique<absl::Status>(
            absl::UnavailableError("its watch connection closed"));
      }
    }
    cv_.SignalAll();
  }
  // A notice being sent finishes before the caller writes to the socket.
  absl::MutexLock lock(&w->send_mu);
}

absl::Status LocalRepointer::Notify(uint64_t session,
                                    const std::shared_ptr<Watch>& w,
                                    const TargetEntry& entry,
                                    absl::Time deadline) {
  if (modules_ == nullptr) {
    return absl::FailedPreconditionError("local execution is off");
  }
  KREG_ASSIGN_OR_RETURN(
      UniqueFd fd,
      modules_->Open(entry.module_digest, entry.module_size, session));
  v1::SessionResponse notice;
  v1::Repoint* r = notice.mutable_repoint();
  r->set_target_name(entry.key.name);
  r->set_platform(PlatformName(entry.key.platform));
  r->set_generation(entry.generation);
  r->set_module_digest(entry.module_digest);
  r->set_module_size(entry.module_size);
  r->set_func_name(entry.func_name);
  absl::MutexLock lock(&w->send_mu);
  const int fds[1] = {fd.get()};
  const wire::Clock::time_point by =
      wire::Clock::now() + absl::ToChronoNanoseconds(deadline - absl::Now());
  const int rc = wire::SendMessage(w->sock.get(), notice, fds, 1, &by);
  if (rc == wire::kOk) return absl::OkStatus();
  // Part of the frame may have gone: the connection is of no further use.
  // The shim reopens it when it reads again; Activate sends what it missed.
  ::shutdown(w->sock.get(), SHUT_RDWR);
  return absl::UnavailableError(absl::StrCat(
      "sending it the notice failed (",
      rc == wire::kTimedOut ? "it did not read its watch connection in time"
                            : wire::ResultText(rc),
      "); kregd closed that connection"));
}

std::map<pid_t, std::pair<PeerCred, uint32_t>> LocalRepointer::LocalHolders(
    const TargetEntry& entry) {
  std::map<pid_t, std::pair<PeerCred, uint32_t>> out;
  for (const auto& [id, held] : bindings_->HoldersOf(entry.key)) {
    // A pinned binding is told too (the shim acks its pin); one holding
    // another uid's generation for its content is not (DESIGN §14 rule 1).
    if (held.second.local &&
        (held.second.pinned ||
         FollowedGeneration(entry, held.second, held.first.uid) ==
             entry.generation)) {
      out[held.first.pid] = {held.first, held.second.generation};
    }
  }
  return out;
}

std::vector<Repointer::Laggard> LocalRepointer::Repoint(
    const TargetEntry& entry, absl::Time deadline) {
  const std::map<pid_t, std::pair<PeerCred, uint32_t>> holders =
      LocalHolders(entry);
  if (holders.empty()) return {};
  Wait wait{entry.key, entry.generation, {}};
  std::vector<std::pair<uint64_t, std::shared_ptr<Watch>>> watches;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [pid, holder] : holders) wait.acks[pid] = nullptr;
    for (const auto& [id, w] : watches_) {
      if (w->sock.ok() && holders.count(w->peer.pid) != 0) {
        watches.emplace_back(id, w);
      }
    }
    waits_.push_back(&wait);
  }
  // One sender each: a process that stopped reading delays only its own
  // notice, until the deadline.
  std::vector<std::thread> senders;
  for (const auto& [id, w] : watches) {
    senders.emplace_back([this, &wait, &entry, deadline, id = id, w = w] {
      const absl::Status sent = Notify(id, w, entry, deadline);
      absl::MutexLock lock(&mu_);
      if (!sent.ok() && wait.acks[w->peer.pid] == nullptr) {
        wait.acks[w->peer.pid] = std::make_unique<absl::Status>(sent);
        cv_.SignalAll();
      }
    });
  }
  {
    absl::MutexLock lock(&mu_);
    auto all_acked = [&] {
      for (const auto& [id, s] : wait.acks) {
        if (s == nullptr) return false;
      }
      return true;
    };
    while (!all_acked() && !cv_.WaitWithDeadline(&mu_, deadline)) {
    }
    waits_.erase(std::find(waits_.begin(), waits_.end(), &wait));
  }
  for (std::thread& t : senders) t.join();
  // A process that ended meanwhile holds nothing any more.
  const std::map<pid_t, std::pair<PeerCred, uint32_t>> still =
      LocalHolders(entry);
  std::vector<Laggard> laggards;
  for (const auto& [pid, holder] : holders) {
    if (still.count(pid) == 0) continue;
    const absl::Status* acked = wait.acks[pid].get();
    if (acked != nullptr && acked->ok()) continue;
    spdlog::warn("re-pointing \"{}\" ({}) to generation {}: pid {}: {}",
                 entry.key.name, PlatformName(entry.key.platform),
                 entry.generation, pid,
                 acked == nullptr ? "no acknowledgement before the deadline "
                                    "(no watch connection, or no answer on "
                                    "it)"
                                  : acked->ToString());
    // What it resolved or acknowledged last.
    laggards.push_back(
        Laggard{holder.first, /*local=*/true,
                holder.second != 0 ? holder.second : entry.generation - 1});
  }
  return laggards;
}

}  // namespace kreg
