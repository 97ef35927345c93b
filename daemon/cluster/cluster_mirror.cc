#include "daemon/cluster/cluster_mirror.h"

#include <unistd.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "daemon/registry/refusals.h"
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

ClusterMirror::ClusterMirror(Registry* registry, NameReservations* reservations,
                             Replacement* replacement,
                             BindingAuthority* authority)
    : registry_(registry),
      reservations_(reservations),
      replacement_(replacement),
      authority_(authority) {
  registry_->SetKeyBinder(this);
  registry_->AddInstallHook(this);
  reservations_->SetBindingAuthority(authority);
  replacement_->SetBindingAuthority(authority);
}

absl::StatusOr<RegisterOutcome> ClusterMirror::BindNew(
    const RegisterArgs& args, const std::string& digest,
    const std::string& cid) {
  BindingAuthority* const authority = authority_;
  HandlerLoader* const loader = registry_->loader();
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
      registry_->OweSweep();
    } else if (staged.has_value()) {
      loader->Discard(*staged);
    }
  });
  if (args.kind == TargetKind::kModule) {
    proposed.module_digest = digest;
    proposed.module_size = args.module_bytes.size();
    // Probe before claiming: a module that is no handler must not win the
    // name cluster-wide, even for a moment.
    KREG_ASSIGN_OR_RETURN(staged, loader->Stage(args.module_bytes, digest));
    KREG_ASSIGN_OR_RETURN(proposed.handler_info,
                          loader->Probe(*staged, args.func_name));
  }
  KREG_ASSIGN_OR_RETURN(ClaimResult claim, authority->Claim(proposed));
  const bool created = claim.created;
  TargetEntry binding = created ? proposed : claim.existing;
  if (!created) {
    bool replacing = false;
    absl::Status same =
        registry_->CheckIdentity(binding, args, cid, digest, &replacing);
    if (!same.ok()) {
      registry_->CountRefusal();
      return same;
    }
    if (replacing) {
      return replacement_->Change(args, digest, cid,
                                  std::make_shared<TargetEntry>(binding));
    }
    // Equal to the binding made elsewhere (a no-op cluster-wide). Unless
    // our bytes are its module, every host runs the binding's module: a
    // peer's copy.
    if (binding.kind == TargetKind::kModule &&
        binding.module_digest != digest) {
      return Adopt(args, binding);
    }
    binding.handler_info = proposed.handler_info;
  }
  // Commit here; a binding this host made is taken back if that fails.
  auto unclaim = absl::MakeCleanup([&] {
    if (created) authority->Unclaim(proposed);
  });
  if (staged.has_value()) {
    KREG_RETURN_IF_ERROR(loader->Commit(*staged));
    committed = true;
    KREG_RETURN_IF_ERROR(loader->Check(digest));
  }
  KREG_ASSIGN_OR_RETURN(EntryPtr entry, registry_->Insert(binding));
  std::move(unclaim).Cancel();
  std::move(discard).Cancel();
  authority->Committed(*entry);
  return RegisterOutcome{created, entry};
}

absl::StatusOr<RegisterOutcome> ClusterMirror::Adopt(
    const RegisterArgs& args, const TargetEntry& binding) {
  absl::StatusOr<std::string> bytes =
      authority_->FetchModule(binding.module_digest, binding.module_size);
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
  KREG_ASSIGN_OR_RETURN(EntryPtr entry, registry_->Install(binding, *bytes));
  return RegisterOutcome{false, entry};
}

absl::Status ClusterMirror::Committing(TargetEntry* entry,
                                       const TargetEntry* previous) {
  if (previous == nullptr) return absl::OkStatus();
  // The generation is made for every host or not at all. Should the
  // journal fail after this, a retry of the replacement completes it here
  // (the authority finds it made already).
  entry->host = authority_->HostName();
  absl::Status st = authority_->Replace(*previous, *entry);
  if (!st.ok() && st.code() != absl::StatusCode::kUnavailable) {
    registry_->CountRefusal();
  }
  return st;
}

void ClusterMirror::Committed(const TargetEntry& entry) {
  authority_->Committed(entry);
}

absl::Status ClusterMirror::Retiring(const TargetEntry& entry) {
  // The binding goes everywhere or nowhere.
  return authority_->Release(entry);
}

absl::Status ClusterMirror::Mirror(const TargetEntry& binding,
                                   const std::string& module_bytes) {
  EntryPtr local;
  std::unique_ptr<Registry::Hold> hold = registry_->HoldKey(
      binding.key,
      [&](const EntryPtr& e, uid_t* uid, std::string* digest, uint64_t* size) {
        local = e;
        if (local != nullptr && SameBinding(*local, binding) &&
            local->unavailable.empty()) {
          return false;
        }
        if (local != nullptr && SameLineage(*local, binding) &&
            binding.generation < local->generation) {
          // An earlier generation (e.g. this host's own, seen after its
          // next).
          spdlog::info("cluster: {} generation {} ignored: this host has {}",
                       Named(binding.key), binding.generation,
                       local->generation);
          return false;
        }
        *uid = binding.registered_by.uid;
        *digest = binding.module_digest;
        *size = binding.module_size;
        return true;
      });
  if (hold == nullptr) return absl::OkStatus();
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
    KREG_RETURN_IF_ERROR(registry_->Remove(local, Self()));
  }
  absl::StatusOr<EntryPtr> entry;
  if (binding.kind == TargetKind::kInProcess) {
    entry = registry_->Insert(binding);
  } else if (!module_bytes.empty()) {
    entry = registry_->Install(binding, module_bytes);
  } else {
    KREG_RETURN_IF_ERROR(
        registry_->loader()->CheckStored(binding.module_digest));
    entry = registry_->Insert(binding);
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
    std::vector<Repointer::Laggard> laggards =
        replacement_->RepointHere(**entry);
    if (!laggards.empty()) {
      spdlog::warn("cluster: {}",
                   LaggardsMessage(**entry, laggards, {},
                                   replacement_->limits().timeout));
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

void ClusterMirror::Acknowledge(
    const TargetEntry& binding,
    const std::vector<Repointer::Laggard>& laggards) {
  if (binding.generation >= 2) authority_->PublishAck(binding, laggards, "");
}

void ClusterMirror::MirrorFailed(const TargetEntry& binding,
                                 const std::string& why) {
  BindingAuthority* const authority = authority_;
  if (binding.generation < 2) return;
  std::vector<PeerCred> holders;
  if (BindingOracle* oracle = registry_->oracle())
    holders = oracle->Holders(binding.key);
  if (holders.empty()) {
    authority->PublishAck(binding, {}, "");  // nothing here runs it
    return;
  }
  EntryPtr local = registry_->Lookup(binding.key);
  authority->PublishAck(
      binding, {},
      absl::StrCat("it could not take generation ", binding.generation, " (",
                   why, "), so its processes pid ", Pids(holders),
                   " keep generation ", local ? local->generation : 0));
}

absl::Status ClusterMirror::StoreModule(const std::string& digest,
                                        const std::string& bytes) {
  HandlerLoader* const loader = registry_->loader();
  if (Sha256Digest(bytes) != digest) {
    return absl::DataLossError(absl::StrCat("bytes offered as module ", digest,
                                            " have digest ",
                                            Sha256Digest(bytes), "; refused"));
  }
  KREG_ASSIGN_OR_RETURN(StagedModule staged, loader->Stage(bytes, digest));
  absl::Status st = loader->Commit(staged);
  if (!st.ok()) loader->Discard(staged);
  return st;
}

absl::Status ClusterMirror::Unmirror(const TargetEntry& retired,
                                     const std::string& why) {
  EntryPtr local;
  std::unique_ptr<Registry::Hold> hold = registry_->HoldKey(
      retired.key,
      [&](const EntryPtr& e, uid_t* uid, std::string* digest, uint64_t* size) {
        local = e;
        if (local == nullptr || !SameBinding(*local, retired)) return false;
        *uid = local->registered_by.uid;
        *digest = local->module_digest;
        *size = local->module_size;
        return true;
      });
  if (hold == nullptr) return absl::OkStatus();
  KREG_RETURN_IF_ERROR(registry_->Remove(local, Self()));
  std::string bound;
  if (BindingOracle* oracle = registry_->oracle()) {
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
