#include "daemon/registry/registry.h"

#include <unistd.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "daemon/base/platform_table.h"
#include "daemon/registry/refusals.h"
#include "daemon/store/module_store.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

constexpr uid_t kRoot = 0;

QuotaLimits WithAdmin(QuotaLimits limits) {
  if (limits.admin_uid == static_cast<uid_t>(-1))
    limits.admin_uid = ::geteuid();
  return limits;
}

}  // namespace

Registry::Registry(HandlerLoader* loader, EntryLog* log, QuotaLimits limits)
    : loader_(loader), log_(log), limits_(WithAdmin(limits)) {}

void Registry::AddAdmission(AdmissionPolicy* policy) {
  absl::MutexLock lock(&hooks_mu_);
  admissions_.push_back(policy);
}

void Registry::AddInstallHook(InstallHook* hook) {
  absl::MutexLock lock(&hooks_mu_);
  hooks_.push_back(hook);
}

std::vector<AdmissionPolicy*> Registry::admissions() const {
  absl::MutexLock lock(&hooks_mu_);
  return admissions_;
}

std::vector<InstallHook*> Registry::hooks() const {
  absl::MutexLock lock(&hooks_mu_);
  return hooks_;
}

absl::Status Registry::CheckSame(const TargetEntry& existing, TargetKind kind,
                                 const std::string& cid,
                                 const std::string& func_name,
                                 const RegisterArgs* request) const {
  if (existing.kind == kind && existing.content_id == cid &&
      existing.func_name == func_name) {
    return absl::OkStatus();
  }
  absl::Status refusal = OtherContent(existing, kind, cid, func_name);
  ChangePolicy* change = change_.load();
  std::string hint = change ? change->RefusalHint(existing, kind, request) : "";
  if (hint.empty()) return refusal;
  return absl::FailedPreconditionError(absl::StrCat(refusal.message(), hint));
}

absl::Status Registry::CheckIdentity(const TargetEntry& existing,
                                     const RegisterArgs& args,
                                     const std::string& cid,
                                     const std::string& digest,
                                     bool* changing) const {
  *changing = false;
  absl::Status same =
      CheckSame(existing, args.kind, cid, args.func_name, &args);
  if (same.ok()) return CheckOwnerOrDigest(existing, args.peer, digest);
  if (ChangePolicy* change = change_.load()) {
    bool take = false;
    KREG_RETURN_IF_ERROR(change->Accept(existing, args, &take));
    if (take) {
      *changing = true;
      return absl::OkStatus();
    }
  }
  if (args.kind == TargetKind::kModule && !args.content_id.empty() &&
      existing.module_digest == digest &&
      existing.func_name == args.func_name) {
    return OnlyContentIdDiffers(same, digest);
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
  ChangePolicy* change = change_.load();
  if (out.ok() && change != nullptr) out = change->Finish(*std::move(out));
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

std::unique_ptr<Registry::Hold> Registry::HoldKey(
    const TargetKey& key,
    absl::FunctionRef<bool(const EntryPtr&, uid_t*, std::string*, uint64_t*)>
        take) {
  absl::MutexLock lock(&mu_);
  AwaitFree({key});
  Pending p;
  if (!take(LookupLocked(key), &p.uid, &p.digest, &p.size)) return nullptr;
  pending_[key] = std::move(p);
  return std::make_unique<Hold>(this, std::vector<TargetKey>{key});
}

absl::Status Registry::WhileIdle(
    absl::FunctionRef<absl::Status(const std::vector<EntryPtr>&)> fn) {
  absl::MutexLock lock(&mu_);
  AwaitIdle();
  std::vector<EntryPtr> entries;
  for (const auto& [key, e] : entries_) entries.push_back(e);
  return fn(entries);
}

bool Registry::InProgress(const TargetKey& key,
                          const std::string& digest) const {
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(key);
  return it != pending_.end() && it->second.digest == digest;
}

absl::StatusOr<RegisterOutcome> Registry::Decide(const RegisterArgs& args,
                                                 const std::string& digest) {
  if (args.kind == TargetKind::kModule) {
    KREG_RETURN_IF_ERROR(CheckClaimedDigest(args.content_id, digest));
  }
  const std::string& cid = args.content_id.empty() ? digest : args.content_id;
  // NSS lookups (the caller's groups, a holder's name in a refusal) run
  // without the lock, so that a slow one holds back only this request:
  // refusals are found on a snapshot first. The decision under the lock
  // repeats the checks (a change meanwhile is decided there).
  AdmissionNote note;
  if (absl::Status refused = RefusalNow(args, cid, digest, &note);
      !refused.ok()) {
    refused_.fetch_add(1);
    return refused;
  }
  const std::vector<AdmissionPolicy*> policies = admissions();
  EntryPtr existing;
  bool changing = false;
  {
    absl::MutexLock lock(&mu_);
    AwaitFree({args.key});
    for (AdmissionPolicy* policy : policies) {
      if (absl::Status admitted = policy->Admit(args, note); !admitted.ok()) {
        refused_.fetch_add(1);
        return admitted;
      }
    }
    existing = LookupLocked(args.key);
    if (existing != nullptr) {
      absl::Status same =
          CheckIdentity(*existing, args, cid, digest, &changing);
      if (!same.ok()) {
        refused_.fetch_add(1);
        return same;
      }
      if (!changing && (existing->unavailable.empty() ||
                        existing->kind == TargetKind::kInProcess)) {
        return RegisterOutcome{false, existing};
      }
    }
    if (existing == nullptr || changing) {
      // A change adds a module, not a registration.
      KREG_RETURN_IF_ERROR(
          CheckLimits(args, digest, /*new_name=*/existing == nullptr));
    }
    pending_[args.key] = Pending{
        args.peer.uid, digest,
        args.kind == TargetKind::kModule ? args.module_bytes.size() : 0};
  }
  // The key is held: the work below (a probe may take 20 s, fsyncs, a
  // collaborator's remote call) holds back only requests for this key.
  Hold hold(this, {args.key});
  if (changing) return change_.load()->Change(args, digest, cid, existing);
  if (existing == nullptr) {
    if (KeyBinder* binder = binder_.load()) {
      return binder->BindNew(args, digest, cid);
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
    // these bytes are not it: keep the name taken, say how to repair.
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
  KREG_ASSIGN_OR_RETURN(
      EntryPtr installed,
      Install(*entry, args.module_bytes, /*journal=*/existing == nullptr));
  if (existing != nullptr) {
    spdlog::info("repaired target {} ({}) from re-registered bytes",
                 entry->key.name, PlatformName(entry->key.platform));
  }
  return RegisterOutcome{existing == nullptr, installed};
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
  KREG_ASSIGN_OR_RETURN(EntryPtr inserted, Insert(entry));
  return RegisterOutcome{true, inserted};
}

absl::StatusOr<EntryPtr> Registry::Install(const TargetEntry& entry,
                                           const std::string& bytes,
                                           bool journal,
                                           const TargetEntry* previous) {
  // Never loaded before its digest matches, whoever sent it.
  const std::string digest = Sha256Digest(bytes);
  if (digest != entry.module_digest) {
    return absl::DataLossError(absl::StrCat(
        "module bytes for ", Named(entry.key), " have digest ", digest,
        ", not the binding's ", entry.module_digest, "; refused"));
  }
  KREG_ASSIGN_OR_RETURN(StagedModule staged, loader_->Stage(bytes, digest));
  // Until the journal has the entry, a failure removes what this request
  // wrote: nothing of a refused module stays in the store.
  bool committed = false;
  auto discard = absl::MakeCleanup([&] {
    if (committed) {
      OweSweep();
    } else {
      loader_->Discard(staged);
    }
  });
  KREG_ASSIGN_OR_RETURN(HandlerInfo info,
                        loader_->Probe(staged, entry.func_name));
  const std::vector<InstallHook*> around = hooks();
  for (InstallHook* hook : around) {
    KREG_RETURN_IF_ERROR(hook->Probed(entry, info));
  }
  KREG_RETURN_IF_ERROR(loader_->Commit(staged));
  committed = true;
  KREG_RETURN_IF_ERROR(loader_->Check(digest));
  auto local = std::make_shared<TargetEntry>(entry);
  local->handler_info = info;
  local->unavailable.clear();
  for (InstallHook* hook : around) {
    KREG_RETURN_IF_ERROR(hook->Committing(local.get(), previous));
  }
  if (journal) {
    KREG_RETURN_IF_ERROR(log_->Append(*local));
  }
  std::move(discard).Cancel();
  {
    absl::MutexLock lock(&mu_);
    entries_[local->key] = local;
  }
  for (InstallHook* hook : around) hook->Committed(*local);
  return EntryPtr(local);
}

absl::StatusOr<EntryPtr> Registry::Insert(const TargetEntry& entry) {
  auto e = std::make_shared<TargetEntry>(entry);
  e->unavailable.clear();
  KREG_RETURN_IF_ERROR(log_->Append(*e));
  absl::MutexLock lock(&mu_);
  entries_[e->key] = e;
  return EntryPtr(e);
}

absl::Status Registry::Remove(const EntryPtr& entry, const PeerCred& by) {
  Retirement r{entry->key, entry->content_id, entry->module_digest, by,
               NowMicros()};
  KREG_RETURN_IF_ERROR(log_->AppendRetirement(r));
  {
    absl::MutexLock lock(&mu_);
    entries_.erase(entry->key);
  }
  OweSweep();
  return absl::OkStatus();
}

absl::Status Registry::Restore(const TargetEntry& journaled) {
  EntryPtr existing = Lookup(journaled.key);
  if (existing != nullptr) {
    return CheckSame(*existing, journaled.kind, journaled.content_id,
                     journaled.func_name, /*request=*/nullptr);
  }
  auto entry = std::make_shared<TargetEntry>(journaled);
  absl::Status ready = entry->kind == TargetKind::kInProcess
                           ? absl::OkStatus()
                           : loader_->CheckStored(entry->module_digest);
  if (!ready.ok()) {
    // Keep the name taken so it can never be re-pointed; identical
    // re-registration repairs it.
    entry->unavailable = std::string(ready.message());
  }
  absl::MutexLock lock(&mu_);
  entries_[entry->key] = entry;
  return ready;
}

absl::Status Registry::RefusalNow(const RegisterArgs& args,
                                  const std::string& cid,
                                  const std::string& digest,
                                  AdmissionNote* note) const {
  for (AdmissionPolicy* policy : admissions()) {
    KREG_RETURN_IF_ERROR(policy->Screen(args, note));
  }
  EntryPtr seen = Lookup(args.key);
  bool changing = false;
  return seen == nullptr ? absl::OkStatus()
                         : CheckIdentity(*seen, args, cid, digest, &changing);
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

Registry::UidUse Registry::UseOf(uid_t uid) const {
  UidUse use;
  auto keep = [&](const std::string& digest, uint64_t size) {
    if (!digest.empty() && use.digests.emplace(digest, size).second) {
      use.bytes += size;
    }
  };
  for (const auto& [key, e] : entries_) {
    if (e->registered_by.uid != uid) continue;
    ++use.registrations;
    for (const auto& [digest, size] : KeptModules(*e)) keep(digest, size);
  }
  // A new name being registered counts as held until it is decided.
  for (const auto& [key, p] : pending_) {
    if (p.uid == uid && entries_.count(key) == 0) {
      ++use.registrations;
      keep(p.digest, p.size);
    }
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
    return TooManyRegistrations(args.key, uid, use.registrations,
                                limits_.max_registrations_per_uid);
  }
  const uint64_t more =
      args.kind == TargetKind::kModule && use.digests.count(digest) == 0
          ? args.module_bytes.size()
          : 0;
  if (use.bytes + more > limits_.max_store_bytes_per_uid) {
    return TooManyBytes(args.key, uid, use.bytes, more,
                        limits_.max_store_bytes_per_uid);
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
    return TooManyRegistrations(key, peer.uid, use.registrations,
                                limits_.max_registrations_per_uid);
  }
  for (const auto& [digest, held_size] : use.digests) {
    if (held_size == size) return absl::OkStatus();  // may be this module
  }
  if (use.bytes + size > limits_.max_store_bytes_per_uid) {
    return TooManyBytes(key, peer.uid, use.bytes, size,
                        limits_.max_store_bytes_per_uid);
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
  // The keys are held: the sessions' answer, the hooks and the journal are
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
  const std::vector<InstallHook*> around = hooks();
  for (const EntryPtr& e : targets) {
    for (InstallHook* hook : around) {
      failed = hook->Retiring(*e);
      if (!failed.ok()) break;
    }
    if (!failed.ok()) {
      spdlog::warn("retirement of {} by uid {} not made: {}", Named(e->key),
                   peer.uid, std::string(failed.message()));
      break;
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
    for (const auto& [digest, size] : KeptModules(*e)) keep.insert(digest);
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
  KREG_RETURN_IF_ERROR(
      CheckAdmin(peer, "garbage collection of the module store"));
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
