// Registry: per-uid limits, retirement of names, garbage collection of the
// module store (the parts of DESIGN §2 that end or bound a registration).
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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
  absl::MutexLock lock(&mu_);
  for (const auto& [key, e] : entries_) {
    if (e->registered_by.uid != uid) continue;
    ++use.registrations;
    if (!e->module_digest.empty() &&
        use.digests.emplace(e->module_digest, e->module_size).second) {
      use.bytes += e->module_size;
    }
  }
  return use;
}

absl::Status Registry::CheckLimits(const RegisterArgs& args,
                                   const std::string& digest) const {
  const uid_t uid = args.peer.uid;
  if (uid == kRoot) return absl::OkStatus();
  const UidUse use = UseOf(uid);
  if (use.registrations + 1 > limits_.max_registrations_per_uid) {
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
  if (peer.uid == kRoot || Lookup(key) != nullptr) return absl::OkStatus();
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
  absl::MutexLock serial(&register_mu_);
  std::vector<EntryPtr> targets;
  if (platform.has_value()) {
    if (EntryPtr e = Lookup({name, *platform})) targets.push_back(e);
  } else {
    targets = Find(name);
  }
  if (targets.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "cannot retire \"", name, "\"",
        platform ? absl::StrCat(" on platform ", PlatformName(*platform)) : "",
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
  if (BindingOracle* oracle = oracle_.load()) {
    for (const EntryPtr& e : targets) {
      std::vector<pid_t> pids = oracle->PidsBinding(e->key);
      if (!pids.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "cannot retire ", Named(e->key),
            ": live sessions have it bound (pid", pids.size() > 1 ? "s " : " ",
            absl::StrJoin(pids, ", "),
            "); retire it once those processes have exited"));
      }
    }
  }
  const int64_t now_us =
      std::chrono::duration_cast<std::chrono::microseconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count();
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
    Retirement r{e->key, e->content_id, e->module_digest, peer, now_us};
    failed = log_->AppendRetirement(r);
    if (!failed.ok()) {
      spdlog::error("retirement of {} by uid {} failed: {}", Named(e->key),
                    peer.uid, std::string(failed.message()));
      break;
    }
    {
      absl::MutexLock lock(&mu_);
      entries_.erase(e->key);
    }
    spdlog::info(
        "retired {} (content_id \"{}\", module {}, registered by uid {}) at "
        "the request of uid {} pid {}",
        Named(e->key), e->content_id, e->module_digest, e->registered_by.uid,
        peer.uid, peer.pid);
    retired.push_back(e);
  }
  // Also after a failure: what was retired before it is journaled.
  if (!retired.empty()) DropUnreferenced();
  if (!failed.ok()) return failed;
  return retired;
}

absl::StatusOr<GcOutcome> Registry::SweepStore() {
  std::set<std::string> keep;
  for (const EntryPtr& e : List()) {
    if (!e->module_digest.empty()) keep.insert(e->module_digest);
  }
  return loader_->RemoveUnreferenced(keep);
}

void Registry::DropUnreferenced() {
  absl::StatusOr<GcOutcome> out = SweepStore();
  if (!out.ok()) {
    spdlog::warn(
        "module store: cannot remove the modules of retired targets ({}); "
        "`kregctl gc` retries",
        std::string(out.status().message()));
  } else if (out->files_removed > 0) {
    spdlog::info(
        "module store: removed {} files ({} bytes) no target references any "
        "more",
        out->files_removed, out->bytes_removed);
  }
}

absl::StatusOr<GcOutcome> Registry::CollectGarbage(const PeerCred& peer) {
  if (peer.uid != kRoot && peer.uid != limits_.admin_uid) {
    return absl::PermissionDeniedError(absl::StrCat(
        "garbage collection of the module store is for root or kregd's own "
        "uid (",
        limits_.admin_uid, "); uid ", peer.uid, " may not run it"));
  }
  // register_mu_ keeps registrations (which stage and commit files) out
  // while the store is swept.
  absl::MutexLock serial(&register_mu_);
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
