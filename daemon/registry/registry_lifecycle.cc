// Registry: per-uid limits, retirement of names, garbage collection of the
// module store (the parts of DESIGN §2 that end or bound a registration).
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/base/platform_table.h"
#include "daemon/registry/registry.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

constexpr uid_t kRoot = 0;

}  // namespace

namespace {

constexpr char kRemedy[] =
    "; retire targets you no longer use (kregctl retire NAME) or ask the "
    "operator to raise the limit";

absl::Status TooManyRegistrations(const TargetKey& key, uid_t uid,
                                  uint64_t registrations,
                                  const RegistryLimits& limits) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "cannot register ", Named(key), ": uid ", uid, " already has ",
      registrations, " registrations, the limit per uid is ",
      limits.max_registrations_per_uid, " (max_registrations_per_uid)",
      kRemedy));
}

absl::Status TooManyBytes(const TargetKey& key, uid_t uid, uint64_t bytes,
                          uint64_t more, const RegistryLimits& limits) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "cannot register ", Named(key), ": its ", more,
      "-byte module would bring uid ", uid, "'s module store use to ",
      bytes + more, " bytes (now ", bytes, "); the limit per uid is ",
      limits.max_store_bytes_per_uid, " bytes (max_store_bytes_per_uid)",
      kRemedy));
}

}  // namespace

Registry::UidUse Registry::UseOf(uid_t uid) const {
  UidUse use;
  auto hold = [&](const std::string& digest, uint64_t size) {
    ++use.registrations;
    if (!digest.empty() && use.digests.emplace(digest, size).second) {
      use.bytes += size;
    }
  };
  for (const auto& [key, e] : entries_) {
    if (e->registered_by.uid != uid) continue;
    hold(e->module_digest, e->module_size);
    // Earlier generations' modules stay in the store (docs/replace.md).
    for (const Generation& g : e->generations) {
      if (!g.module_digest.empty() &&
          use.digests.emplace(g.module_digest, g.module_size).second) {
        use.bytes += g.module_size;
      }
    }
  }
  // A new name being registered counts as held until it is decided.
  for (const auto& [key, p] : pending_) {
    if (p.uid == uid && entries_.count(key) == 0) hold(p.digest, p.size);
  }
  return use;
}

absl::Status Registry::CheckLimits(const RegisterArgs& args,
                                   const std::string& digest,
                                   bool new_name) const {
  const uid_t uid = args.peer.uid;
  if (uid == kRoot) return absl::OkStatus();
  const UidUse use = UseOf(uid);
  if (new_name && use.registrations + 1 > limits_.max_registrations_per_uid) {
    return TooManyRegistrations(args.key, uid, use.registrations, limits_);
  }
  const uint64_t more =
      args.kind == TargetKind::kModule && use.digests.count(digest) == 0
          ? args.module_bytes.size()
          : 0;
  if (use.bytes + more > limits_.max_store_bytes_per_uid) {
    return TooManyBytes(args.key, uid, use.bytes, more, limits_);
  }
  return absl::OkStatus();
}

absl::Status Registry::PrecheckUpload(const TargetKey& key, uint64_t size,
                                      const PeerCred& peer) const {
  if (peer.uid == kRoot) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  if (LookupLocked(key) != nullptr) return absl::OkStatus();
  const UidUse use = UseOf(peer.uid);
  if (use.registrations + 1 > limits_.max_registrations_per_uid) {
    return TooManyRegistrations(key, peer.uid, use.registrations, limits_);
  }
  for (const auto& [digest, held_size] : use.digests) {
    if (held_size == size) return absl::OkStatus();  // may be this module
  }
  if (use.bytes + size > limits_.max_store_bytes_per_uid) {
    return TooManyBytes(key, peer.uid, use.bytes, size, limits_);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<EntryPtr>> Registry::Retire(
    const std::string& name, std::optional<Platform> platform,
    const PeerCred& peer) {
  std::vector<TargetKey> keys;
  if (platform.has_value()) {
    keys.push_back({name, *platform});
  } else {
    for (Platform p : AllPlatforms()) keys.push_back({name, p});
  }
  std::vector<EntryPtr> targets;
  {
    absl::MutexLock lock(&mu_);
    AwaitFree(keys);
    for (const TargetKey& key : keys) {
      if (EntryPtr e = LookupLocked(key)) targets.push_back(e);
    }
    if (targets.empty()) {
      return absl::NotFoundError(absl::StrCat(
          "cannot retire \"", name, "\"",
          platform ? absl::StrCat(" on platform ", PlatformName(*platform))
                   : "",
          ": no such target is registered; `kregctl list` shows what is"));
    }
    for (const EntryPtr& e : targets) {
      if (peer.uid != kRoot && peer.uid != e->registered_by.uid) {
        return absl::PermissionDeniedError(
            absl::StrCat("cannot retire ", Named(e->key),
                         ": it was registered by uid ", e->registered_by.uid,
                         " and only that uid or root may retire it "
                         "(you are uid ",
                         peer.uid, ")"));
      }
    }
    keys.clear();
    for (const EntryPtr& e : targets) {
      keys.push_back(e->key);
      pending_[e->key] =
          Pending{e->registered_by.uid, e->module_digest, e->module_size};
    }
  }
  // The keys are reserved: the sessions' answer, etcd and the journal are
  // consulted without holding back requests for other names.
  Hold hold(this, keys);
  if (BindingOracle* oracle = oracle_.load()) {
    for (const EntryPtr& e : targets) {
      std::vector<PeerCred> holders = oracle->Holders(e->key);
      if (!holders.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "cannot retire ", Named(e->key), ": live sessions have it bound (",
            absl::StrJoin(holders, ", ",
                          [](std::string* out, const PeerCred& p) {
                            absl::StrAppend(out, "pid ", p.pid, " of ",
                                            UserName(p.uid));
                          }),
            "); retire it once those processes have exited: their user or "
            "root can end them (kill PID); `kregctl sessions` lists what each "
            "holds"));
      }
    }
  }
  std::vector<EntryPtr> retired;
  absl::Status failed;
  for (const EntryPtr& e : targets) {
    // Cluster mode: the binding goes everywhere or nowhere.
    if (BindingAuthority* authority = authority_.load()) {
      failed = authority->Release(*e);
      if (!failed.ok()) {
        spdlog::warn("retirement of {} by uid {} not made: {}", Named(e->key),
                     peer.uid, std::string(failed.message()));
        break;
      }
    }
    failed = Remove(e, peer);
    if (!failed.ok()) {
      spdlog::error("retirement of {} by uid {} failed: {}", Named(e->key),
                    peer.uid, std::string(failed.message()));
      break;
    }
    spdlog::info(
        "retired {} (content_id \"{}\", module {}, registered by uid {}) at "
        "the request of uid {} pid {}",
        Named(e->key), e->content_id, e->module_digest, e->registered_by.uid,
        peer.uid, peer.pid);
    retired.push_back(e);
  }
  // Also after a failure: what was retired before it is journaled.
  if (!failed.ok()) return failed;
  return retired;
}

absl::StatusOr<GcOutcome> Registry::SweepStore() {
  std::set<std::string> keep;
  for (const EntryPtr& e : List()) {
    if (!e->module_digest.empty()) keep.insert(e->module_digest);
    // Earlier generations: processes may still run them (docs/replace.md).
    for (const Generation& g : e->generations) {
      if (!g.module_digest.empty()) keep.insert(g.module_digest);
    }
  }
  absl::StatusOr<GcOutcome> out = loader_->RemoveUnreferenced(keep);
  absl::MutexLock lock(&mu_);
  sweeping_ = false;
  return out;
}

absl::Status Registry::CheckAdmin(const PeerCred& peer,
                                  const char* what) const {
  if (peer.uid == kRoot || peer.uid == limits_.admin_uid) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      absl::StrCat(what, " is for root or kregd's own uid (", limits_.admin_uid,
                   "); uid ", peer.uid, " may not do it"));
}

absl::StatusOr<GcOutcome> Registry::CollectGarbage(const PeerCred& peer) {
  absl::Status admin =
      CheckAdmin(peer, "garbage collection of the module store");
  if (!admin.ok()) return admin;
  // Registrations stage and commit files: the sweep waits for those in
  // progress and holds back new ones until it is done.
  {
    absl::MutexLock lock(&mu_);
    AwaitIdle();
    sweeping_ = true;
    sweep_owed_ = false;
  }
  absl::StatusOr<GcOutcome> out = SweepStore();
  if (out.ok()) {
    spdlog::info(
        "gc by uid {} pid {}: removed {} unreferenced store files ({} bytes); "
        "{} files ({} bytes) kept",
        peer.uid, peer.pid, out->files_removed, out->bytes_removed,
        out->files_kept, out->bytes_kept);
  }
  return out;
}

}  // namespace kreg
