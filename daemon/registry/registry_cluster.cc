// Registry in cluster mode (DESIGN §10): a new binding is claimed from the
// BindingAuthority (etcd) before it is committed here, and bindings made on
// other hosts are mirrored into the local registry and journal.
#include <unistd.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/registry/registry.h"
#include "daemon/store/module_store.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

bool SameBinding(const TargetEntry& a, const TargetEntry& b) {
  return a.kind == b.kind && a.content_id == b.content_id &&
         a.func_name == b.func_name && a.module_digest == b.module_digest;
}

// Whether `a` and `b` are generations of one module target of one owner
// (docs/replace.md §9): then the higher generation replaces the lower.
bool SameLineage(const TargetEntry& a, const TargetEntry& b) {
  return a.kind == TargetKind::kModule && b.kind == TargetKind::kModule &&
         a.registered_by.uid == b.registered_by.uid;
}

// The pids of `holders`, for a log line.
std::string Pids(const std::vector<PeerCred>& holders) {
  return absl::StrJoin(holders, ", ", [](std::string* out, const PeerCred& p) {
    absl::StrAppend(out, p.pid);
  });
}

// kregd itself, as the one who retires a local entry the cluster replaced.
PeerCred Self() { return PeerCred{::geteuid(), ::getegid(), ::getpid()}; }

}  // namespace

absl::StatusOr<RegisterOutcome> Registry::RegisterClaimed(
    const RegisterArgs& args, const std::string& digest, const std::string& cid,
    BindingAuthority* authority) {
  TargetEntry proposed;
  proposed.key = args.key;
  proposed.kind = args.kind;
  proposed.func_name = args.func_name;
  proposed.content_id = cid;
  proposed.registered_by = args.peer;
  proposed.registered_at_us = NowMicros();
  proposed.origin = args.origin;
  proposed.host = authority->HostName();
  std::optional<StagedModule> staged;
  bool committed = false;
  auto discard = absl::MakeCleanup([&] {
    if (committed) {
      OweSweep();
    } else if (staged.has_value()) {
      loader_->Discard(*staged);
    }
  });
  if (args.kind == TargetKind::kModule) {
    proposed.module_digest = digest;
    proposed.module_size = args.module_bytes.size();
    // Probe before claiming: a module that is no handler must not win the
    // name cluster-wide, even for a moment.
    absl::StatusOr<StagedModule> st = loader_->Stage(args.module_bytes, digest);
    if (!st.ok()) return st.status();
    staged = *std::move(st);
    absl::StatusOr<HandlerInfo> info = loader_->Probe(*staged, args.func_name);
    if (!info.ok()) return info.status();
    proposed.handler_info = *info;
  }
  absl::StatusOr<ClaimResult> claim = authority->Claim(proposed);
  if (!claim.ok()) return claim.status();
  const bool created = claim->created;
  TargetEntry binding = created ? proposed : claim->existing;
  if (!created) {
    bool replacing = false;
    absl::Status same = CheckIdentity(binding, args, cid, digest, &replacing);
    if (!same.ok()) {
      refused_.fetch_add(1);
      return same;
    }
    if (replacing) {
      return Replace(args, digest, cid, std::make_shared<TargetEntry>(binding));
    }
    // Equal to the binding made elsewhere (a no-op cluster-wide). Unless
    // our bytes are its module, every host runs the binding's module: a
    // peer's copy.
    if (binding.kind == TargetKind::kModule &&
        binding.module_digest != digest) {
      return AdoptClaimed(args, binding, authority);
    }
    binding.handler_info = proposed.handler_info;
  }
  // Commit here; a binding this host made is taken back if that fails.
  auto unclaim = absl::MakeCleanup([&] {
    if (created) authority->Unclaim(proposed);
  });
  if (staged.has_value()) {
    absl::Status st = loader_->Commit(*staged);
    if (!st.ok()) return st;
    committed = true;
    st = loader_->Check(digest);
    if (!st.ok()) return st;
  }
  absl::StatusOr<EntryPtr> entry = Insert(binding);
  if (!entry.ok()) return entry.status();
  std::move(unclaim).Cancel();
  std::move(discard).Cancel();
  authority->Committed(**entry);
  return RegisterOutcome{created, *entry};
}

bool Registry::Registering(const TargetKey& key,
                           const std::string& digest) const {
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(key);
  return it != pending_.end() && it->second.digest == digest;
}

absl::StatusOr<RegisterOutcome> Registry::AdoptClaimed(
    const RegisterArgs& args, const TargetEntry& binding,
    BindingAuthority* authority) {
  absl::StatusOr<std::string> bytes =
      authority->FetchModule(binding.module_digest, binding.module_size);
  if (!bytes.ok()) {
    return absl::Status(
        bytes.status().code(),
        absl::StrCat(Named(args.key),
                     " is bound in the cluster registry (host ", binding.host,
                     ") to module ", binding.module_digest,
                     ", which this host does not hold and could not fetch "
                     "from a peer: ",
                     bytes.status().message()));
  }
  absl::StatusOr<EntryPtr> entry = Install(binding, *bytes);
  if (!entry.ok()) return entry.status();
  return RegisterOutcome{false, *entry};
}

absl::StatusOr<EntryPtr> Registry::Install(const TargetEntry& entry,
                                           const std::string& bytes,
                                           bool journal,
                                           const TargetEntry* replaces) {
  // Never loaded before its digest matches, whoever sent it.
  const std::string digest = Sha256Digest(bytes);
  if (digest != entry.module_digest) {
    return absl::DataLossError(absl::StrCat(
        "module bytes for ", Named(entry.key), " have digest ", digest,
        ", not the binding's ", entry.module_digest, "; refused"));
  }
  absl::StatusOr<StagedModule> staged = loader_->Stage(bytes, digest);
  if (!staged.ok()) return staged.status();
  // Until the journal has the entry, a failure removes what this request
  // wrote: nothing of a refused module stays in the store.
  bool committed = false;
  auto discard = absl::MakeCleanup([&] {
    if (committed) {
      OweSweep();
    } else {
      loader_->Discard(*staged);
    }
  });
  absl::StatusOr<HandlerInfo> info = loader_->Probe(*staged, entry.func_name);
  if (!info.ok()) return info.status();
  if (entry.generations.size() >= 2) {
    absl::Status compatible = CheckCompatible(entry, *info);
    if (!compatible.ok()) return compatible;
  }
  absl::Status st = loader_->Commit(*staged);
  if (!st.ok()) return st;
  committed = true;
  st = loader_->Check(digest);
  if (!st.ok()) return st;
  auto local = std::make_shared<TargetEntry>(entry);
  local->handler_info = *info;
  if (!local->generations.empty())
    local->generations.back().handler_info = *info;
  local->unavailable.clear();
  BindingAuthority* authority = authority_.load();
  if (replaces != nullptr && authority != nullptr) {
    // The generation is made for every host or not at all. Should the
    // journal fail below, a retry of the replacement completes it here
    // (the authority finds it made already).
    local->host = authority->HostName();
    st = authority->Replace(*replaces, *local);
    if (!st.ok()) {
      if (st.code() != absl::StatusCode::kUnavailable) refused_.fetch_add(1);
      return st;
    }
  }
  if (journal) {
    st = log_->Append(*local);
    if (!st.ok()) return st;
  }
  std::move(discard).Cancel();
  {
    absl::MutexLock lock(&mu_);
    entries_[local->key] = local;
  }
  if (authority != nullptr) authority->Committed(*local);
  return EntryPtr(local);
}

absl::StatusOr<EntryPtr> Registry::Insert(const TargetEntry& entry) {
  auto e = std::make_shared<TargetEntry>(entry);
  e->unavailable.clear();
  absl::Status logged = log_->Append(*e);
  if (!logged.ok()) return logged;
  absl::MutexLock lock(&mu_);
  entries_[e->key] = e;
  return EntryPtr(e);
}

absl::Status Registry::Remove(const EntryPtr& entry, const PeerCred& by) {
  Retirement r{entry->key, entry->content_id, entry->module_digest, by,
               NowMicros()};
  absl::Status logged = log_->AppendRetirement(r);
  if (!logged.ok()) return logged;
  {
    absl::MutexLock lock(&mu_);
    entries_.erase(entry->key);
  }
  OweSweep();
  return absl::OkStatus();
}

absl::Status Registry::Mirror(const TargetEntry& binding,
                              const std::string& module_bytes) {
  EntryPtr local;
  {
    absl::MutexLock lock(&mu_);
    AwaitFree({binding.key});
    local = LookupLocked(binding.key);
    if (local != nullptr && SameBinding(*local, binding) &&
        local->unavailable.empty()) {
      return absl::OkStatus();
    }
    if (local != nullptr && SameLineage(*local, binding) &&
        binding.generation < local->generation) {
      // An earlier generation (e.g. this host's own, seen after its next).
      spdlog::info("cluster: {} generation {} ignored: this host has {}",
                   Named(binding.key), binding.generation, local->generation);
      return absl::OkStatus();
    }
    pending_[binding.key] = Pending{binding.registered_by.uid,
                                    binding.module_digest, binding.module_size};
  }
  Hold hold(this, {binding.key});
  const bool replaced = local != nullptr && SameLineage(*local, binding) &&
                        binding.generation > local->generation;
  if (local != nullptr && !SameBinding(*local, binding) && !replaced) {
    spdlog::error(
        "CLUSTER CONFLICT: {} is bound here to content {} (module {}, "
        "function \"{}\", registered by uid {}{}) but cluster-wide to content "
        "{} (module {}, function \"{}\", host {}, uid {}); the cluster's "
        "binding wins for new sessions, live sessions keep what they bound",
        Named(binding.key), local->content_id, local->module_digest,
        local->func_name, local->registered_by.uid,
        local->host.empty() ? "" : absl::StrCat(" on host ", local->host),
        binding.content_id, binding.module_digest, binding.func_name,
        binding.host, binding.registered_by.uid);
    absl::Status removed = Remove(local, Self());
    if (!removed.ok()) return removed;
  }
  absl::StatusOr<EntryPtr> entry;
  if (binding.kind == TargetKind::kInProcess) {
    entry = Insert(binding);
  } else if (!module_bytes.empty()) {
    entry = Install(binding, module_bytes);
  } else {
    absl::Status stored = loader_->CheckStored(binding.module_digest);
    if (!stored.ok()) return stored;
    entry = Insert(binding);
  }
  if (!entry.ok()) return entry.status();
  if (replaced) {
    spdlog::info(
        "cluster: {} replaced on host {}: generation {} (content {}) -> {} "
        "(content {}, module {})",
        Named(binding.key), binding.host, local->generation, local->content_id,
        binding.generation, binding.content_id, binding.module_digest);
    // This host's holders switch as on the replacing host (docs/replace.md
    // §9), while the key stays reserved; the replacing host waits for the
    // acknowledgement.
    std::vector<Repointer::Laggard> laggards;
    if (Repointer* repointer = repointer_.load()) {
      laggards =
          repointer->Repoint(**entry, absl::Now() + limits_.replace_timeout);
      if (!laggards.empty()) {
        spdlog::warn("cluster: {}", LaggardsMessage(**entry, laggards, {},
                                                    limits_.replace_timeout));
      }
    }
    Acknowledge(**entry, laggards);
    return absl::OkStatus();
  }
  Acknowledge(**entry, {});  // a generation 2 or later new here: no holder
  spdlog::info("cluster: {} bound as on host {} (content {}, module {})",
               Named(binding.key), binding.host, binding.content_id,
               binding.module_digest.empty() ? "none" : binding.module_digest);
  return absl::OkStatus();
}

void Registry::Acknowledge(const TargetEntry& binding,
                           const std::vector<Repointer::Laggard>& laggards) {
  BindingAuthority* authority = authority_.load();
  if (authority != nullptr && binding.generation >= 2) {
    authority->PublishAck(binding, laggards, "");
  }
}

void Registry::MirrorFailed(const TargetEntry& binding,
                            const std::string& why) {
  BindingAuthority* authority = authority_.load();
  if (authority == nullptr || binding.generation < 2) return;
  std::vector<PeerCred> holders;
  if (BindingOracle* oracle = oracle_.load())
    holders = oracle->Holders(binding.key);
  if (holders.empty()) {
    authority->PublishAck(binding, {}, "");  // nothing here runs it
    return;
  }
  EntryPtr local = Lookup(binding.key);
  authority->PublishAck(
      binding, {},
      absl::StrCat("it could not take generation ", binding.generation, " (",
                   why, "), so its processes pid ", Pids(holders),
                   " keep generation ", local ? local->generation : 0));
}

absl::Status Registry::StoreModule(const std::string& digest,
                                   const std::string& bytes) {
  if (Sha256Digest(bytes) != digest) {
    return absl::DataLossError(absl::StrCat("bytes offered as module ", digest,
                                            " have digest ",
                                            Sha256Digest(bytes), "; refused"));
  }
  absl::StatusOr<StagedModule> staged = loader_->Stage(bytes, digest);
  if (!staged.ok()) return staged.status();
  absl::Status st = loader_->Commit(*staged);
  if (!st.ok()) loader_->Discard(*staged);
  return st;
}

absl::Status Registry::Unmirror(const TargetEntry& retired,
                                const std::string& why) {
  EntryPtr local;
  {
    absl::MutexLock lock(&mu_);
    AwaitFree({retired.key});
    local = LookupLocked(retired.key);
    if (local == nullptr || !SameBinding(*local, retired)) {
      return absl::OkStatus();
    }
    pending_[retired.key] = Pending{local->registered_by.uid,
                                    local->module_digest, local->module_size};
  }
  Hold hold(this, {retired.key});
  absl::Status removed = Remove(local, Self());
  if (!removed.ok()) return removed;
  std::string bound;
  if (BindingOracle* oracle = oracle_.load()) {
    std::vector<PeerCred> holders = oracle->Holders(local->key);
    if (!holders.empty()) {
      bound = absl::StrCat(" (live sessions of pids ", Pids(holders),
                           " keep it until they end)");
    }
  }
  spdlog::warn("cluster: {} (content {}) retired here: {}{}", Named(local->key),
               local->content_id, why, bound);
  return absl::OkStatus();
}

}  // namespace kreg
