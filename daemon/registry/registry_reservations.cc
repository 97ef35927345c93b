// Registry: operators' reservations of target names for a uid or a group
// (docs/operator-guide.md, "Name reservations").
#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/registry/registry.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

// Whether `peer` is the owner: the uid, or for a group the caller's gid or
// one of its user's supplementary groups: `groups`, which callers look up
// before taking the registry's lock; looked up here when they did not (a
// reservation made meanwhile).
bool IsOwner(const NameReservation& r, const PeerCred& peer,
             const std::vector<gid_t>* groups) {
  if (!r.group) return peer.uid == r.owner;
  if (peer.gid == r.owner) return true;
  std::vector<gid_t> looked_up;
  if (groups == nullptr) {
    looked_up = GroupsOf(peer.uid, peer.gid);
    groups = &looked_up;
  }
  return std::find(groups->begin(), groups->end(), r.owner) != groups->end();
}

}  // namespace

std::optional<NameReservation> Registry::ReservedForOthers(
    const std::map<std::string, NameReservation>& reservations,
    const TargetKey& key, const PeerCred& peer,
    const std::vector<gid_t>* groups) {
  if (peer.uid == 0) return std::nullopt;
  for (const auto& [pattern, r] : reservations) {
    if (r.Matches(key.name) && !IsOwner(r, peer, groups)) return r;
  }
  return std::nullopt;
}

absl::Status Registry::ReservedRefusal(const TargetKey& key,
                                       const NameReservation& r,
                                       const PeerCred& peer) {
  return absl::PermissionDeniedError(absl::StrCat(
      "cannot register ", Named(key), ": names matching \"", r.pattern,
      "\" are reserved for ", OwnerName(r), " on this host, and uid ", peer.uid,
      " is not ", r.group ? "in that group" : "that uid",
      ". Register under a name outside the reservation, or ask the "
      "operator (`kregctl reserve`, with no pattern, lists them)."));
}

absl::Status Registry::Reserve(NameReservation r, const PeerCred& peer) {
  absl::Status admin = CheckAdmin(peer, "reserving target names");
  if (!admin.ok()) return admin;
  r.by = peer;
  r.at_us = NowMicros();
  // NSS lookups before the lock: the owner's name, and for a group the
  // groups of the users whose targets match.
  const std::string owner = OwnerName(r);
  std::map<std::pair<uid_t, gid_t>, std::vector<gid_t>> groups;
  if (r.group) {
    for (const EntryPtr& e : List()) {
      const PeerCred& by = e->registered_by;
      if (r.Matches(e->key.name) && !groups.count({by.uid, by.gid})) {
        groups[{by.uid, by.gid}] = GroupsOf(by.uid, by.gid);
      }
    }
  }
  absl::MutexLock lock(&mu_);
  // Requests in progress finish first: none of them escapes the check.
  AwaitIdle();
  std::vector<std::string> others;
  for (const auto& [key, e] : entries_) {
    const PeerCred& by = e->registered_by;
    auto known = groups.find({by.uid, by.gid});
    if (r.Matches(key.name) && by.uid != 0 &&
        !IsOwner(r, by, known == groups.end() ? nullptr : &known->second)) {
      others.push_back(
          absl::StrCat(Named(key), " by uid ", e->registered_by.uid));
    }
  }
  if (!others.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot reserve \"", r.pattern, "\" for ", owner,
        ": it matches targets registered by others: ",
        absl::StrJoin(others.begin(),
                      others.begin() + std::min<size_t>(others.size(), 5),
                      "; "),
        others.size() > 5 ? absl::StrCat(" and ", others.size() - 5, " more")
                          : "",
        ". Retire them first (kregctl retire NAME), or reserve a narrower "
        "pattern"));
  }
  // Cluster mode: every host's first (a bounded etcd call; this admin
  // request holds back the others meanwhile, so none escapes the check).
  if (BindingAuthority* authority = authority_.load()) {
    absl::Status published = authority->PublishReservation(r, false);
    if (!published.ok()) return published;
  }
  absl::Status logged = log_->AppendReservation(r, /*lifted=*/false);
  if (!logged.ok()) return logged;
  spdlog::info("names \"{}\" reserved for {} by uid {} pid {}", r.pattern,
               owner, peer.uid, peer.pid);
  reservations_[r.pattern] = r;
  return absl::OkStatus();
}

absl::Status Registry::Unreserve(const std::string& pattern,
                                 const PeerCred& peer) {
  absl::Status admin = CheckAdmin(peer, "lifting a name reservation");
  if (!admin.ok()) return admin;
  NameReservation lifted;
  {
    absl::MutexLock lock(&mu_);
    auto it = reservations_.find(pattern);
    if (it == reservations_.end()) {
      return absl::NotFoundError(absl::StrCat(
          "no reservation of \"", pattern,
          "\" to lift; `kregctl reserve`, with no pattern, lists them, "
          "with their patterns spelled exactly"));
    }
    lifted = it->second;
    lifted.by = peer;
    lifted.at_us = NowMicros();
    if (BindingAuthority* authority = authority_.load()) {
      absl::Status published = authority->PublishReservation(lifted, true);
      if (!published.ok()) return published;
    }
    absl::Status logged = log_->AppendReservation(lifted, /*lifted=*/true);
    if (!logged.ok()) return logged;
    reservations_.erase(it);
  }
  spdlog::info("reservation of \"{}\" for {} lifted by uid {} pid {}", pattern,
               OwnerName(lifted), peer.uid, peer.pid);
  return absl::OkStatus();
}

std::vector<NameReservation> Registry::Reservations() const {
  absl::MutexLock lock(&mu_);
  std::vector<NameReservation> out;
  for (const auto& [pattern, r] : reservations_) out.push_back(r);
  return out;
}

void Registry::RestoreReservation(const NameReservation& r) {
  absl::MutexLock lock(&mu_);
  reservations_[r.pattern] = r;
}

absl::Status Registry::MirrorReservation(const NameReservation& r,
                                         bool lifted) {
  {
    absl::MutexLock lock(&mu_);
    auto it = reservations_.find(r.pattern);
    const bool same = it != reservations_.end() && !lifted &&
                      it->second.owner == r.owner &&
                      it->second.group == r.group;
    if (same || (lifted && it == reservations_.end())) return absl::OkStatus();
    absl::Status logged = log_->AppendReservation(r, lifted);
    if (!logged.ok()) return logged;
    if (lifted) {
      reservations_.erase(it);
    } else {
      reservations_[r.pattern] = r;
    }
  }
  spdlog::info("cluster: reservation of \"{}\" for {} {} by uid {} (etcd)",
               r.pattern, OwnerName(r), lifted ? "lifted" : "made", r.by.uid);
  return absl::OkStatus();
}

}  // namespace kreg
