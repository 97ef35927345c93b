#include "daemon/registry/registry.h"

#include <unistd.h>

#include <ctime>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/base/log_limit.h"
#include "daemon/base/platform_table.h"
#include "daemon/store/module_store.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

std::string Describe(TargetKind kind, const std::string& content_id,
                     const std::string& func_name, Platform platform) {
  return absl::StrCat(kind == TargetKind::kInProcess ? "in-process " : "",
                      "content ", content_id, ", function \"", func_name,
                      "\", platform ", PlatformName(platform));
}

RegistryLimits WithAdmin(RegistryLimits limits) {
  if (limits.admin_uid == static_cast<uid_t>(-1))
    limits.admin_uid = ::geteuid();
  return limits;
}

// A content_id of the form "sha256:..." claims to be the module's digest:
// it must be. INVALID_ARGUMENT quoting both otherwise.
absl::Status CheckClaimedDigest(const std::string& content_id,
                                const std::string& digest) {
  if (content_id.size() < 7 ||
      !absl::EqualsIgnoreCase(content_id.substr(0, 7), "sha256:") ||
      content_id == digest) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "content_id \"", content_id,
      "\" has the form of a module digest but the module's digest is ", digest,
      "; a \"sha256:\" content_id must be the module's own digest. Omit "
      "content_id (the digest is then used), pass the module's digest, or "
      "use a build cache key without the \"sha256:\" prefix."));
}

// For an identity equal by content_id: the same uid may rebuild (the
// build-cache case); another uid must bring the same module bytes, or it
// would be handed the owner's code under its own content_id claim.
absl::Status CheckOwnerOrDigest(const TargetEntry& existing,
                                const PeerCred& peer,
                                const std::string& digest) {
  if (existing.kind != TargetKind::kModule ||
      existing.registered_by.uid == peer.uid ||
      existing.module_digest == digest) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "target \"", existing.key.name, "\" (",
      PlatformName(existing.key.platform), ") is registered ",
      existing.host.empty() ? "" : absl::StrCat("on host ", existing.host, " "),
      "by ", Holder(existing), " with content_id \"", existing.content_id,
      "\" and module ", existing.module_digest, " (", existing.origin,
      "); this registration by uid ", peer.uid,
      " claims the same content_id with another module, module ", digest,
      ". A content_id stands for the module only for the uid that "
      "registered it; other uids must register the identical module bytes. "
      "Register the owner's module, or your build under a distinct target "
      "name."));
}

std::string Identity(const RegisterArgs& args, const std::string& digest) {
  if (args.kind == TargetKind::kInProcess) {
    return absl::StrCat("in-process content_id \"", args.content_id,
                        "\", function \"", args.func_name, "\"");
  }
  return absl::StrCat(
      "module ", digest, " (", args.module_bytes.size(), " bytes, ",
      args.origin, ")",
      args.content_id.empty()
          ? ""
          : absl::StrCat(", content_id \"", args.content_id, "\""),
      ", function \"", args.func_name, "\"");
}

// One info line per decision: who, what, the outcome and why.
void LogDecision(const RegisterArgs& args, const std::string& digest,
                 const absl::StatusOr<RegisterOutcome>& out) {
  std::string what =
      absl::StrCat("target \"", args.key.name, "\" (",
                   PlatformName(args.key.platform), ") by uid ", args.peer.uid,
                   " pid ", args.peer.pid, ": ", Identity(args, digest));
  if (out.ok() && out->created) {
    spdlog::info("registration created: {}", what);  // bounded by quotas
    return;
  }
  // Refusals and no-ops a client can repeat at will: rate-limited per uid.
  std::string suppressed;
  if (!PeerLogLimiter().Allow(absl::StrCat("uid ", args.peer.uid),
                              &suppressed)) {
    return;
  }
  if (!out.ok()) {
    spdlog::info("registration refused ({}): {}: {}{}",
                 absl::StatusCodeToString(out.status().code()), what,
                 std::string(out.status().message()), suppressed);
  } else {
    spdlog::info(
        "registration no-op (identical to the entry registered by "
        "uid {}): {}{}",
        out->entry->registered_by.uid, what, suppressed);
  }
}

}  // namespace

std::string Holder(const TargetEntry& e) {
  std::string who = UserName(e.registered_by.uid);
  if (e.registered_at_us > 0) {
    std::time_t t = static_cast<std::time_t>(e.registered_at_us / 1000000);
    struct tm tm;
    char when[32];
    if (::gmtime_r(&t, &tm) != nullptr &&
        std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm) > 0) {
      absl::StrAppend(&who, " since ", when);
    }
  }
  return who;
}

Registry::Registry(HandlerLoader* loader, RegistrationLog* log,
                   RegistryLimits limits)
    : loader_(loader), log_(log), limits_(WithAdmin(limits)) {}

absl::Status Registry::CheckSame(const TargetEntry& existing, TargetKind kind,
                                 const std::string& cid,
                                 const std::string& func_name,
                                 bool replace) const {
  if (existing.kind == kind && existing.content_id == cid &&
      existing.func_name == func_name) {
    return absl::OkStatus();
  }
  // Who holds the name and since when (in cluster mode also on which
  // host: the binding may have been made on another one).
  std::string where =
      existing.host.empty()
          ? absl::StrCat("(first registered by ", Holder(existing), ") ")
          : absl::StrCat("(cluster-wide, first registered on host ",
                         existing.host, " by ", Holder(existing), ") ");
  std::string msg = absl::StrCat(
      "target \"", existing.key.name, "\" is already registered ", where,
      "with ",
      Describe(existing.kind, existing.content_id, existing.func_name,
               existing.key.platform),
      "; refusing to re-point it to ",
      Describe(kind, cid, func_name, existing.key.platform),
      ". XLA binds a handler into every compiled executable, so a live "
      "re-point can be neither performed nor verified. Register the rebuild "
      "under a distinct target name (a new name or a version prefix, e.g. \"",
      existing.key.name, ".v2\").");
  if (replace) {
    absl::StrAppend(&msg,
                    " replace=true was requested, but it is reserved: a "
                    "content change is refused whether or not it is set.");
  } else if (limits_.replace_by_owner && existing.kind == TargetKind::kModule &&
             kind == TargetKind::kModule) {
    absl::StrAppend(&msg, " This kregd lets a target's owner (uid ",
                    existing.registered_by.uid,
                    ") or root replace it in place: register with "
                    "replace=True to make the next generation.");
  }
  return absl::FailedPreconditionError(msg);
}

absl::Status Registry::CheckIdentity(const TargetEntry& existing,
                                     const RegisterArgs& args,
                                     const std::string& cid,
                                     const std::string& digest,
                                     bool* replacing) const {
  *replacing = false;
  absl::Status same =
      CheckSame(existing, args.kind, cid, args.func_name, args.replace);
  if (same.ok()) return CheckOwnerOrDigest(existing, args.peer, digest);
  if (args.replace && limits_.replace_by_owner) {
    absl::Status may = MayReplace(existing, args);
    *replacing = may.ok();
    if (!may.ok()) replaces_refused_.fetch_add(1);
    return may;
  }
  if (args.kind == TargetKind::kModule && !args.content_id.empty() &&
      existing.module_digest == digest &&
      existing.func_name == args.func_name) {
    // The same bytes and function under another content_id: the build
    // cache key changed, not the kernel (e.g. it hashes a temporary
    // include path).
    return absl::FailedPreconditionError(absl::StrCat(
        same.message(), " The module bytes are identical (", digest,
        "): only the content_id differs. A content_id computed from paths "
        "(a temporary build or include directory) changes on every build; "
        "compute it from the sources' contents, or omit it (the module's "
        "digest is then used)."));
  }
  return same;
}

absl::StatusOr<RegisterOutcome> Registry::Register(const RegisterArgs& args) {
  // The module's digest is its store key, and its identity when no
  // content_id is given; computed once here.
  const std::string digest = args.kind == TargetKind::kModule
                                 ? Sha256Digest(args.module_bytes)
                                 : std::string();
  absl::StatusOr<RegisterOutcome> out = Decide(args, digest);
  if (out.ok() && out->replaced) out = AwaitSwitched(*std::move(out));
  LogDecision(args, digest, out);
  return out;
}

void Registry::AwaitFree(const std::vector<TargetKey>& keys) {
  auto free = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    if (sweeping_ || idle_waiters_ > 0) return false;
    for (const TargetKey& key : keys) {
      if (pending_.count(key) != 0) return false;
    }
    return true;
  };
  mu_.Await(absl::Condition(&free));
}

void Registry::AwaitIdle() {
  ++idle_waiters_;
  auto idle = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return pending_.empty() && !sweeping_;
  };
  mu_.Await(absl::Condition(&idle));
  --idle_waiters_;
}

void Registry::Release(const std::vector<TargetKey>& keys) {
  {
    absl::MutexLock lock(&mu_);
    for (const TargetKey& key : keys) pending_.erase(key);
    if (!pending_.empty() || !sweep_owed_ || sweeping_) return;
    sweep_owed_ = false;
    sweeping_ = true;
  }
  absl::StatusOr<GcOutcome> out = SweepStore();
  if (!out.ok()) {
    spdlog::warn(
        "module store: cannot remove the modules no target references any "
        "more ({}); `kregctl gc` retries",
        std::string(out.status().message()));
  } else if (out->files_removed > 0) {
    spdlog::info(
        "module store: removed {} files ({} bytes) no target references any "
        "more",
        out->files_removed, out->bytes_removed);
  }
}

void Registry::OweSweep() {
  absl::MutexLock lock(&mu_);
  sweep_owed_ = true;
}

absl::StatusOr<RegisterOutcome> Registry::Decide(const RegisterArgs& args,
                                                 const std::string& digest) {
  if (args.kind == TargetKind::kModule) {
    absl::Status claimed = CheckClaimedDigest(args.content_id, digest);
    if (!claimed.ok()) return claimed;
  }
  const std::string& cid = args.content_id.empty() ? digest : args.content_id;
  // NSS lookups (the caller's groups, a holder's name in a refusal) run
  // without the lock, so that a slow one holds back only this request:
  // refusals are found on a snapshot first. The decision under the lock
  // repeats the checks (a change meanwhile is decided there).
  std::optional<std::vector<gid_t>> groups;
  if (absl::Status refused = RefusalNow(args, cid, digest, &groups);
      !refused.ok()) {
    refused_.fetch_add(1);
    return refused;
  }
  const std::vector<gid_t>* g = groups.has_value() ? &*groups : nullptr;
  EntryPtr existing;
  bool replacing = false;
  {
    absl::MutexLock lock(&mu_);
    AwaitFree({args.key});
    if (std::optional<NameReservation> r =
            ReservedForOthers(reservations_, args.key, args.peer, g)) {
      refused_.fetch_add(1);
      return ReservedRefusal(args.key, *r, args.peer);
    }
    existing = LookupLocked(args.key);
    if (existing != nullptr) {
      absl::Status same =
          CheckIdentity(*existing, args, cid, digest, &replacing);
      if (!same.ok()) {
        refused_.fetch_add(1);
        return same;
      }
      if (!replacing && (existing->unavailable.empty() ||
                         existing->kind == TargetKind::kInProcess)) {
        return RegisterOutcome{false, existing};
      }
    }
    if (existing == nullptr || replacing) {
      // A replacement adds a module (every generation's stays stored), not
      // a registration.
      absl::Status within =
          CheckLimits(args, digest, /*new_name=*/existing == nullptr);
      if (!within.ok()) return within;
    }
    pending_[args.key] = Pending{
        args.peer.uid, digest,
        args.kind == TargetKind::kModule ? args.module_bytes.size() : 0};
  }
  // The key is reserved: the work below (a probe may take 20 s, fsyncs, an
  // etcd claim) holds back only requests for this key.
  Hold hold(this, {args.key});
  if (replacing) return Replace(args, digest, cid, existing);
  if (existing == nullptr) {
    if (BindingAuthority* authority = authority_.load()) {
      return RegisterClaimed(args, digest, cid, authority);
    }
  }
  if (args.kind == TargetKind::kInProcess) return RegisterInProcess(args);
  return RegisterModule(args, digest, cid, existing);
}

absl::StatusOr<RegisterOutcome> Registry::RegisterModule(
    const RegisterArgs& args, const std::string& digest, const std::string& cid,
    EntryPtr existing) {
  if (existing != nullptr && digest != existing->module_digest) {
    // Same identity (content_id) but the journaled module file is lost and
    // these bytes are not it: keep the name reserved, say how to repair.
    return absl::UnavailableError(absl::StrCat(
        "target \"", existing->key.name, "\" is registered but its module ",
        existing->module_digest, " could not be loaded at start-up (",
        existing->unavailable,
        "); re-register the original module bytes "
        "to repair it"));
  }
  auto entry = std::make_shared<TargetEntry>();
  if (existing != nullptr) {
    // Repair of an entry whose store file was lost or corrupt at start-up:
    // identical identity, fresh copy of the same bytes.
    *entry = *existing;
  } else {
    entry->key = args.key;
    entry->func_name = args.func_name;
    entry->content_id = cid;
    entry->module_digest = digest;
    entry->module_size = args.module_bytes.size();
    entry->registered_by = args.peer;
    entry->registered_at_us = NowMicros();
    entry->origin = args.origin;
  }
  absl::StatusOr<EntryPtr> installed =
      Install(*entry, args.module_bytes, /*journal=*/existing == nullptr);
  if (!installed.ok()) return installed.status();
  if (existing != nullptr) {
    spdlog::info("repaired target {} ({}) from re-registered bytes",
                 entry->key.name, PlatformName(entry->key.platform));
  }
  return RegisterOutcome{existing == nullptr, *installed};
}

absl::StatusOr<RegisterOutcome> Registry::RegisterInProcess(
    const RegisterArgs& args) {
  TargetEntry entry;
  entry.key = args.key;
  entry.kind = TargetKind::kInProcess;
  entry.func_name = args.func_name;
  entry.content_id = args.content_id;
  entry.registered_by = args.peer;
  entry.registered_at_us = NowMicros();
  entry.origin = args.origin;
  absl::StatusOr<EntryPtr> inserted = Insert(entry);
  if (!inserted.ok()) return inserted.status();
  return RegisterOutcome{true, *inserted};
}

absl::Status Registry::Restore(const TargetEntry& journaled) {
  EntryPtr existing = Lookup(journaled.key);
  if (existing != nullptr) {
    return CheckSame(*existing, journaled.kind, journaled.content_id,
                     journaled.func_name, /*replace=*/false);
  }
  auto entry = std::make_shared<TargetEntry>(journaled);
  absl::Status ready = entry->kind == TargetKind::kInProcess
                           ? absl::OkStatus()
                           : loader_->CheckStored(entry->module_digest);
  if (!ready.ok()) {
    // Keep the name reserved so it can never be re-pointed; identical
    // re-registration repairs it.
    entry->unavailable = std::string(ready.message());
  }
  absl::MutexLock lock(&mu_);
  entries_[entry->key] = entry;
  return ready;
}

absl::Status Registry::RefusalNow(
    const RegisterArgs& args, const std::string& cid, const std::string& digest,
    std::optional<std::vector<gid_t>>* groups) const {
  std::map<std::string, NameReservation> matching;
  EntryPtr seen;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [pattern, r] : reservations_) {
      if (r.Matches(args.key.name)) matching.emplace(pattern, r);
    }
    seen = LookupLocked(args.key);
  }
  const PeerCred& peer = args.peer;
  for (const auto& [pattern, r] : matching) {
    if (peer.uid != 0 && r.group && r.owner != peer.gid) {
      *groups = GroupsOf(peer.uid, peer.gid);
      break;
    }
  }
  if (std::optional<NameReservation> r =
          ReservedForOthers(matching, args.key, peer,
                            groups->has_value() ? &**groups : nullptr)) {
    return ReservedRefusal(args.key, *r, peer);
  }
  bool replacing = false;
  return seen == nullptr ? absl::OkStatus()
                         : CheckIdentity(*seen, args, cid, digest, &replacing);
}

EntryPtr Registry::LookupLocked(const TargetKey& key) const {
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : it->second;
}

EntryPtr Registry::Lookup(const TargetKey& key) const {
  absl::MutexLock lock(&mu_);
  return LookupLocked(key);
}

std::vector<EntryPtr> Registry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<EntryPtr> out;
  out.reserve(entries_.size());
  for (const auto& [key, entry] : entries_) out.push_back(entry);
  return out;
}

std::vector<EntryPtr> Registry::Find(const std::string& name) const {
  std::vector<EntryPtr> out;
  for (Platform p : AllPlatforms()) {
    if (EntryPtr e = Lookup({name, p})) out.push_back(e);
  }
  return out;
}

}  // namespace kreg
