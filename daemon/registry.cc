#include "daemon/registry.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "daemon/module_store.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

std::string Describe(TargetKind kind, const std::string &content_id,
                     const std::string &func_name, Platform platform) {
  return absl::StrCat(kind == TargetKind::kInProcess ? "in-process " : "",
                      "content ", content_id, ", function \"", func_name,
                      "\", platform ", PlatformName(platform));
}

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

} // namespace

Registry::Registry(HandlerLoader *loader, RegistrationLog *log)
    : loader_(loader), log_(log) {}

absl::Status Registry::CheckSame(const TargetEntry &existing, TargetKind kind,
                                 const std::string &cid,
                                 const std::string &func_name,
                                 bool replace) const {
  if (existing.kind == kind && existing.content_id == cid &&
      existing.func_name == func_name) {
    return absl::OkStatus();
  }
  std::string msg = absl::StrCat(
      "target \"", existing.key.name, "\" is already registered with ",
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
  }
  return absl::FailedPreconditionError(msg);
}

absl::StatusOr<RegisterOutcome> Registry::Register(const RegisterArgs &args) {
  // The module's digest is its store key, and its identity when no
  // content_id is given; computed once here.
  const std::string digest = args.kind == TargetKind::kModule
                                 ? Sha256Digest(args.module_bytes)
                                 : std::string();
  const std::string &cid = args.content_id.empty() ? digest : args.content_id;
  absl::MutexLock serial(&register_mu_);
  EntryPtr existing = Lookup(args.key);
  if (existing != nullptr) {
    absl::Status same =
        CheckSame(*existing, args.kind, cid, args.func_name, args.replace);
    if (!same.ok()) {
      refused_.fetch_add(1);
      return same;
    }
    if (existing->unavailable.empty() ||
        existing->kind == TargetKind::kInProcess) {
      return RegisterOutcome{false, existing};
    }
  }
  if (args.kind == TargetKind::kInProcess)
    return RegisterInProcess(args);
  absl::Status stored = loader_->Store(args.module_bytes, digest);
  if (!stored.ok())
    return stored;
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
  absl::StatusOr<HandlerInfo> info = loader_->Probe(digest, args.func_name);
  if (!info.ok())
    return info.status();
  absl::Status ready = loader_->Check(digest);
  if (!ready.ok())
    return ready;

  auto entry = std::make_shared<TargetEntry>();
  if (existing != nullptr) {
    // Repair of an entry whose store file was lost or corrupt at start-up:
    // identical identity, fresh copy of the same bytes.
    *entry = *existing;
    entry->unavailable.clear();
    spdlog::info("repaired target {} ({}) from re-registered bytes",
                 entry->key.name, PlatformName(entry->key.platform));
  } else {
    entry->key = args.key;
    entry->func_name = args.func_name;
    entry->content_id = cid;
    entry->module_digest = digest;
    entry->module_size = args.module_bytes.size();
    entry->handler_info = *info;
    entry->registered_by = args.peer;
    entry->registered_at_us = NowMicros();
    entry->origin = args.origin;
    absl::Status logged = log_->Append(*entry);
    if (!logged.ok())
      return logged;
  }
  absl::MutexLock lock(&mu_);
  entries_[args.key] = entry;
  return RegisterOutcome{existing == nullptr, entry};
}

absl::StatusOr<RegisterOutcome>
Registry::RegisterInProcess(const RegisterArgs &args) {
  auto entry = std::make_shared<TargetEntry>();
  entry->key = args.key;
  entry->kind = TargetKind::kInProcess;
  entry->func_name = args.func_name;
  entry->content_id = args.content_id;
  entry->registered_by = args.peer;
  entry->registered_at_us = NowMicros();
  entry->origin = args.origin;
  absl::Status logged = log_->Append(*entry);
  if (!logged.ok())
    return logged;
  absl::MutexLock lock(&mu_);
  entries_[args.key] = entry;
  return RegisterOutcome{true, entry};
}

absl::Status Registry::Restore(const TargetEntry &journaled) {
  absl::MutexLock serial(&register_mu_);
  EntryPtr existing = Lookup(journaled.key);
  if (existing != nullptr) {
    return CheckSame(*existing, journaled.kind, journaled.content_id,
                     journaled.func_name, /*replace=*/false);
  }
  auto entry = std::make_shared<TargetEntry>(journaled);
  if (entry->kind == TargetKind::kInProcess) {
    absl::MutexLock lock(&mu_);
    entries_[entry->key] = entry;
    return absl::OkStatus();
  }
  absl::Status ready = loader_->CheckStored(entry->module_digest);
  if (!ready.ok()) {
    // Keep the name reserved so it can never be re-pointed; identical
    // re-registration repairs it.
    entry->unavailable = std::string(ready.message());
  }
  absl::MutexLock lock(&mu_);
  entries_[entry->key] = entry;
  return ready;
}

EntryPtr Registry::Lookup(const TargetKey &key) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : it->second;
}

std::vector<EntryPtr> Registry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<EntryPtr> out;
  out.reserve(entries_.size());
  for (const auto &[key, entry] : entries_)
    out.push_back(entry);
  return out;
}

std::vector<EntryPtr> Registry::Find(const std::string &name) const {
  std::vector<EntryPtr> out;
  for (Platform p : {Platform::kCpu, Platform::kCuda}) {
    if (EntryPtr e = Lookup({name, p}))
      out.push_back(e);
  }
  return out;
}

} // namespace kreg
