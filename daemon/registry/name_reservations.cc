#include "daemon/registry/name_reservations.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
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

// The reservation in `reservations` of someone else that matches
// `key.name`, if any (root is never refused); `groups`: the caller's
// groups, or nullptr to look them up when needed.
std::optional<NameReservation> ReservedForOthers(
    const std::map<std::string, NameReservation>& reservations,
    const TargetKey& key, const PeerCred& peer,
    const std::vector<gid_t>* groups) {
  if (peer.uid == 0) return std::nullopt;
  for (const auto& [pattern, r] : reservations) {
    if (r.Matches(key.name) && !IsOwner(r, peer, groups)) return r;
  }
  return std::nullopt;
}

// PERMISSION_DENIED naming `r`'s owner (an NSS lookup: not under a lock
// others wait for when it can be helped).
absl::Status ReservedRefusal(const TargetKey& key, const NameReservation& r,
                             const PeerCred& peer) {
  return absl::PermissionDeniedError(absl::StrCat(
      "cannot register ", Named(key), ": names matching \"", r.pattern,
      "\" are reserved for ", OwnerName(r), " on this host, and uid ", peer.uid,
      " is not ", r.group ? "in that group" : "that uid",
      ". Register under a name outside the reservation, or ask the "
      "operator (`kregctl reserve`, with no pattern, lists them)."));
}

}  // namespace

NameReservations::NameReservations(Registry* registry, ReservationLog* log)
    : registry_(registry), log_(log) {
  registry_->AddAdmission(this);
}

absl::Status NameReservations::Screen(const RegisterArgs& args,
                                      AdmissionNote* note) const {
  std::map<std::string, NameReservation> matching;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [pattern, r] : reservations_) {
      if (r.Matches(args.key.name)) matching.emplace(pattern, r);
    }
  }
  const PeerCred& peer = args.peer;
  for (const auto& [pattern, r] : matching) {
    if (peer.uid != 0 && r.group && r.owner != peer.gid) {
      note->groups = GroupsOf(peer.uid, peer.gid);
      break;
    }
  }
  if (std::optional<NameReservation> r = ReservedForOthers(
          matching, args.key, peer,
          note->groups.has_value() ? &*note->groups : nullptr)) {
    return ReservedRefusal(args.key, *r, peer);
  }
  return absl::OkStatus();
}

absl::Status NameReservations::Admit(const RegisterArgs& args,
                                     const AdmissionNote& note) const {
  absl::MutexLock lock(&mu_);
  if (std::optional<NameReservation> r = ReservedForOthers(
          reservations_, args.key, args.peer,
          note.groups.has_value() ? &*note.groups : nullptr)) {
    return ReservedRefusal(args.key, *r, args.peer);
  }
  return absl::OkStatus();
}

absl::Status NameReservations::Reserve(NameReservation r,
                                       const PeerCred& peer) {
  KREG_RETURN_IF_ERROR(registry_->CheckAdmin(peer, "reserving target names"));
  r.by = peer;
  r.at_us = NowMicros();
  // NSS lookups before the lock: the owner's name, and for a group the
  // groups of the users whose targets match.
  const std::string owner = OwnerName(r);
  std::map<std::pair<uid_t, gid_t>, std::vector<gid_t>> groups;
  if (r.group) {
    for (const EntryPtr& e : registry_->List()) {
      const PeerCred& by = e->registered_by;
      if (r.Matches(e->key.name) && !groups.count({by.uid, by.gid})) {
        groups[{by.uid, by.gid}] = GroupsOf(by.uid, by.gid);
      }
    }
  }
  // Requests in progress finish first: none of them escapes the check.
  return registry_->WhileIdle([&](const std::vector<EntryPtr>& entries) {
    std::vector<std::string> others;
    for (const EntryPtr& e : entries) {
      const PeerCred& by = e->registered_by;
      auto known = groups.find({by.uid, by.gid});
      if (r.Matches(e->key.name) && by.uid != 0 &&
          !IsOwner(r, by, known == groups.end() ? nullptr : &known->second)) {
        others.push_back(
            absl::StrCat(Named(e->key), " by uid ", e->registered_by.uid));
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
      KREG_RETURN_IF_ERROR(authority->PublishReservation(r, false));
    }
    KREG_RETURN_IF_ERROR(log_->AppendReservation(r, /*lifted=*/false));
    spdlog::info("names \"{}\" reserved for {} by uid {} pid {}", r.pattern,
                 owner, peer.uid, peer.pid);
    absl::MutexLock lock(&mu_);
    reservations_[r.pattern] = r;
    return absl::OkStatus();
  });
}

absl::Status NameReservations::Unreserve(const std::string& pattern,
                                         const PeerCred& peer) {
  KREG_RETURN_IF_ERROR(
      registry_->CheckAdmin(peer, "lifting a name reservation"));
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
      KREG_RETURN_IF_ERROR(authority->PublishReservation(lifted, true));
    }
    KREG_RETURN_IF_ERROR(log_->AppendReservation(lifted, /*lifted=*/true));
    reservations_.erase(it);
  }
  spdlog::info("reservation of \"{}\" for {} lifted by uid {} pid {}", pattern,
               OwnerName(lifted), peer.uid, peer.pid);
  return absl::OkStatus();
}

std::vector<NameReservation> NameReservations::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<NameReservation> out;
  for (const auto& [pattern, r] : reservations_) out.push_back(r);
  return out;
}

void NameReservations::Restore(const NameReservation& r) {
  absl::MutexLock lock(&mu_);
  reservations_[r.pattern] = r;
}

absl::Status NameReservations::Mirror(const NameReservation& r, bool lifted) {
  {
    absl::MutexLock lock(&mu_);
    auto it = reservations_.find(r.pattern);
    const bool same = it != reservations_.end() && !lifted &&
                      it->second.owner == r.owner &&
                      it->second.group == r.group;
    if (same || (lifted && it == reservations_.end())) return absl::OkStatus();
    KREG_RETURN_IF_ERROR(log_->AppendReservation(r, lifted));
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
