// Registry: operators' reservations of target names for a uid or a group
// (docs/operator-guide.md, "Name reservations").
#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/registry/registry.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

// Whether `peer` is the owner: the uid, or for a group the caller's gid or
// one of its user's supplementary groups.
bool IsOwner(const NameReservation& r, const PeerCred& peer) {
  if (!r.group) return peer.uid == r.owner;
  if (peer.gid == r.owner) return true;
  char buf[4096];
  struct passwd pw;
  struct passwd* found = nullptr;
  if (::getpwuid_r(peer.uid, &pw, buf, sizeof(buf), &found) != 0 || !found) {
    return false;
  }
  int n = 64;
  std::vector<gid_t> groups(n);
  if (::getgrouplist(found->pw_name, found->pw_gid, groups.data(), &n) < 0) {
    groups.resize(n);
    if (::getgrouplist(found->pw_name, found->pw_gid, groups.data(), &n) < 0) {
      return false;
    }
  }
  groups.resize(n);
  for (gid_t g : groups) {
    if (g == r.owner) return true;
  }
  return false;
}

}  // namespace

absl::Status Registry::CheckReservations(const TargetKey& key,
                                         const PeerCred& peer) const {
  if (peer.uid == 0) return absl::OkStatus();
  for (const auto& [pattern, r] : reservations_) {
    if (!r.Matches(key.name) || IsOwner(r, peer)) continue;
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot register ", Named(key), ": names matching \"", r.pattern,
        "\" are reserved for ", OwnerName(r), " on this host, and uid ",
        peer.uid, " is not ", r.group ? "in that group" : "that uid",
        ". Register under a name outside the reservation, or ask the "
        "operator (`kregctl reservations` lists them)."));
  }
  return absl::OkStatus();
}

absl::Status Registry::Reserve(NameReservation r, const PeerCred& peer) {
  absl::Status admin = CheckAdmin(peer, "reserving target names");
  if (!admin.ok()) return admin;
  if (authority_.load() != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot reserve \"", r.pattern,
        "\": this kregd runs in cluster mode and name reservations are per "
        "host (not replicated through etcd yet); reserve names on standalone "
        "kregds only"));
  }
  r.by = peer;
  r.at_us = NowMicros();
  absl::MutexLock lock(&mu_);
  // Requests in progress finish first: none of them escapes the check.
  AwaitIdle();
  std::vector<std::string> others;
  for (const auto& [key, e] : entries_) {
    if (r.Matches(key.name) && !IsOwner(r, e->registered_by) &&
        e->registered_by.uid != 0) {
      others.push_back(
          absl::StrCat(Named(key), " by uid ", e->registered_by.uid));
    }
  }
  if (!others.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot reserve \"", r.pattern, "\" for ", OwnerName(r),
        ": it matches targets registered by others: ",
        absl::StrJoin(others.begin(),
                      others.begin() + std::min<size_t>(others.size(), 5),
                      "; "),
        others.size() > 5 ? absl::StrCat(" and ", others.size() - 5, " more")
                          : "",
        ". Retire them first (kregctl retire NAME), or reserve a narrower "
        "pattern"));
  }
  absl::Status logged = log_->AppendReservation(r, /*lifted=*/false);
  if (!logged.ok()) return logged;
  spdlog::info("names \"{}\" reserved for {} by uid {} pid {}", r.pattern,
               OwnerName(r), peer.uid, peer.pid);
  reservations_[r.pattern] = r;
  return absl::OkStatus();
}

absl::Status Registry::Unreserve(const std::string& pattern,
                                 const PeerCred& peer) {
  absl::Status admin = CheckAdmin(peer, "lifting a name reservation");
  if (!admin.ok()) return admin;
  absl::MutexLock lock(&mu_);
  auto it = reservations_.find(pattern);
  if (it == reservations_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "no reservation of \"", pattern,
        "\" to lift; `kregctl reservations` lists them, with their patterns "
        "spelled exactly"));
  }
  NameReservation lifted = it->second;
  lifted.by = peer;
  lifted.at_us = NowMicros();
  absl::Status logged = log_->AppendReservation(lifted, /*lifted=*/true);
  if (!logged.ok()) return logged;
  spdlog::info("reservation of \"{}\" for {} lifted by uid {} pid {}", pattern,
               OwnerName(it->second), peer.uid, peer.pid);
  reservations_.erase(it);
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

}  // namespace kreg
