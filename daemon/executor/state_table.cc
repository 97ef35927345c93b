#include "daemon/executor/state_table.h"

#include <sys/random.h>
#include <unistd.h>

#include <ctime>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

// 2^32 * (a random nonzero 31-bit number) + 1.
uint64_t FirstHandle() {
  uint32_t r = 0;
  if (::getrandom(&r, sizeof(r), 0) != static_cast<ssize_t>(sizeof(r))) {
    r = static_cast<uint32_t>(::getpid()) ^
        static_cast<uint32_t>(::time(nullptr));
  }
  r = (r & 0x7fffffffu) | 1u;
  return (static_cast<uint64_t>(r) << 32) | 1;
}

void Destroy(uint64_t handle, const StateTable::Entry& e) {
  if (!DestroyState(e.state)) {
    spdlog::warn("state {} of \"{}\" has no registered deleter; leaked", handle,
                 e.owner.key.name);
  }
}

}  // namespace

StateTable::StateTable(uint64_t max_per_session)
    : max_per_session_(max_per_session), next_handle_(FirstHandle()) {}

StateTable::~StateTable() {
  absl::MutexLock lock(&mu_);
  for (auto& [handle, held] : states_) Destroy(handle, held.entry);
}

uint64_t StateTable::HeldByLocked(uint64_t session) const {
  auto it = per_session_.find(session);
  return it == per_session_.end() ? 0 : it->second.n;
}

void StateTable::DropLocked(uint64_t session) {
  auto it = per_session_.find(session);
  if (it == per_session_.end()) return;
  Count& c = it->second;
  c.n -= 1;
  if (c.gauge != nullptr) c.gauge->store(c.n, std::memory_order_relaxed);
  TidyLocked(session);
}

void StateTable::TidyLocked(uint64_t session) {
  auto it = per_session_.find(session);
  if (it != per_session_.end() && it->second.n == 0 &&
      it->second.uncharging == 0) {
    per_session_.erase(it);
  }
}

bool StateTable::NoUncharge(SessionRef* ref) {
  return !ref->table->Uncharging(ref->session);  // under mu_ (Await)
}

bool StateTable::Uncharging(uint64_t session) const {
  auto it = per_session_.find(session);
  return it != per_session_.end() && it->second.uncharging != 0;
}

uint64_t StateTable::HeldBy(uint64_t session) const {
  absl::MutexLock lock(&mu_);
  return HeldByLocked(session);
}

size_t StateTable::size() const {
  absl::MutexLock lock(&mu_);
  return states_.size();
}

absl::Status StateTable::CheckRoom(uint64_t session) const {
  absl::MutexLock lock(&mu_);
  const uint64_t held = HeldByLocked(session);
  if (max_per_session_ != 0 && held >= max_per_session_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this session holds ", held,
        " handler states already (one per instantiated call site of a "
        "handler bundle), its limit (max_states_per_session = ",
        max_per_session_,
        "); delete executables you no longer use, or raise "
        "max_states_per_session in kregd's config"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> StateTable::Add(uint64_t session, pid_t pid,
                                         const HostedState& state,
                                         const StateOwner& owner,
                                         std::atomic<uint64_t>* gauge,
                                         std::function<void()> uncharge) {
  if (absl::Status room = CheckRoom(session); !room.ok()) {
    DestroyState(state);
    return room;
  }
  absl::MutexLock lock(&mu_);
  const uint64_t handle = next_handle_++;
  states_.emplace(handle,
                  Held{Entry{state, owner}, session, pid, std::move(uncharge)});
  Count& c = per_session_[session];
  c.n += 1;
  c.gauge = gauge;
  if (gauge != nullptr) gauge->store(c.n, std::memory_order_relaxed);
  return handle;
}

absl::StatusOr<StateTable::Entry> StateTable::Get(uint64_t handle, pid_t pid,
                                                  const TargetKey& key) const {
  absl::MutexLock lock(&mu_);
  auto it = states_.find(handle);
  if (it == states_.end() || it->second.pid != pid) {
    return absl::NotFoundError(absl::StrCat(
        "target \"", key.name, "\": no session of this process holds state ",
        handle,
        " (the executor that held it crashed, taking the call site's state "
        "with it, or the state was released): XLA must instantiate this call "
        "site anew; in JAX call jax.clear_caches() (or jit the function "
        "again) and call it again"));
  }
  if (!(it->second.entry.owner.key == key)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state ", handle, " belongs to target \"",
        it->second.entry.owner.key.name, "\", not \"", key.name, "\""));
  }
  return it->second.entry;
}

absl::Status StateTable::Release(uint64_t handle, pid_t pid) {
  Entry entry;
  std::function<void()> uncharge;
  uint64_t session = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = states_.find(handle);
    if (it == states_.end() || it->second.pid != pid) {
      return absl::NotFoundError(
          absl::StrCat("no session of this process holds state ", handle));
    }
    entry = it->second.entry;
    session = it->second.session;
    uncharge = std::move(it->second.uncharge);
    states_.erase(it);
    DropLocked(session);
    // ReleaseSession(session) waits until the uncharge below ran.
    if (uncharge) per_session_[session].uncharging += 1;
  }
  if (uncharge) {
    uncharge();
    absl::MutexLock lock(&mu_);
    per_session_[session].uncharging -= 1;
    TidyLocked(session);
  }
  Destroy(handle, entry);
  return absl::OkStatus();
}

void StateTable::ReleaseSession(uint64_t session) {
  std::vector<std::pair<uint64_t, Entry>> gone;
  {
    absl::MutexLock lock(&mu_);
    // An uncharge of this session's (Release, on another session's thread)
    // must not run after this returns.
    SessionRef ref{this, session};
    mu_.Await(absl::Condition(&StateTable::NoUncharge, &ref));
    for (auto it = states_.begin(); it != states_.end();) {
      if (it->second.session == session) {
        gone.emplace_back(it->first, it->second.entry);
        it = states_.erase(it);
      } else {
        ++it;
      }
    }
    auto c = per_session_.find(session);
    if (c != per_session_.end()) {
      if (c->second.gauge != nullptr) c->second.gauge->store(0);
      per_session_.erase(c);
    }
  }
  for (const auto& [handle, entry] : gone) Destroy(handle, entry);
}

}  // namespace kreg
