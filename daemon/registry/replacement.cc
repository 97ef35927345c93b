#include "daemon/registry/replacement.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "daemon/base/platform_table.h"
#include "daemon/registry/refusals.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

Generation GenerationOf(const TargetEntry& e, const PeerCred& by,
                        int64_t at_us) {
  return Generation{
      e.generation,   e.content_id, e.module_digest, e.module_size, e.func_name,
      e.handler_info, by,           at_us,           e.origin};
}

// "generation 1 by pid 42 uid 1000 (alice) (pinned), pid 43 ...".
std::string HeldText(
    const std::map<uint32_t, std::vector<BindingOracle::GenerationHold>>&
        held) {
  return absl::StrJoin(held, "; ", [](std::string* s, const auto& gen_holds) {
    absl::StrAppend(
        s, "generation ", gen_holds.first, " by ",
        absl::StrJoin(
            gen_holds.second, ", ",
            [](std::string* t, const BindingOracle::GenerationHold& h) {
              absl::StrAppend(t, "pid ", h.peer.pid, " ", UserName(h.peer.uid),
                              h.pinned ? " (pinned)" : "");
            }));
  });
}

// Whether `args` (replace=true, other content) may replace `existing`:
// its owner or root, module targets only.
absl::Status MayReplace(const TargetEntry& existing, const RegisterArgs& args) {
  if (existing.kind != TargetKind::kModule ||
      args.kind != TargetKind::kModule) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot replace ", Named(existing.key), ": ",
        existing.kind == TargetKind::kModule ? "the request is"
                                             : "the registered target is",
        " an in-process callable (it runs inside its owner process, where "
        "kregd cannot re-point it); only modules can be replaced. Register "
        "it under a distinct target name."));
  }
  if (args.peer.uid != 0 && args.peer.uid != existing.registered_by.uid) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot replace ", Named(existing.key),
                     ": it is owned by ", Holder(existing),
                     ", and only its owner or root may replace it (you "
                     "are uid ",
                     args.peer.uid,
                     "). Ask its owner, or register your build "
                     "under a distinct target name."));
  }
  return absl::OkStatus();
}

}  // namespace

Replacement::Replacement(Registry* registry, ReplaceLimits limits)
    : registry_(registry), limits_(limits) {
  registry_->SetChangePolicy(this);
  registry_->AddInstallHook(this);
}

std::string Replacement::RefusalHint(const TargetEntry& existing,
                                     TargetKind kind,
                                     const RegisterArgs* request) const {
  if (request != nullptr && request->replace) {
    return " replace=true was requested, but it is reserved: a content "
           "change is refused whether or not it is set.";
  }
  if (limits_.by_owner && existing.kind == TargetKind::kModule &&
      kind == TargetKind::kModule) {
    return absl::StrCat(" This kregd lets a target's owner (uid ",
                        existing.registered_by.uid,
                        ") or root replace it in place: register with "
                        "replace=True to make the next generation.");
  }
  return "";
}

absl::Status Replacement::Accept(const TargetEntry& existing,
                                 const RegisterArgs& args, bool* take) const {
  *take = false;
  if (!args.replace || !limits_.by_owner) return absl::OkStatus();
  absl::Status may = MayReplace(existing, args);
  *take = may.ok();
  if (!may.ok()) refused_.fetch_add(1);
  return may;
}

std::vector<Repointer::Laggard> Replacement::RepointHere(
    const TargetEntry& entry) {
  Repointer* repointer = repointer_.load();
  if (repointer == nullptr) return {};
  return repointer->Repoint(entry, absl::Now() + limits_.timeout);
}

absl::StatusOr<std::vector<Generation>> Replacement::LiveGenerations(
    const TargetEntry& existing) const {
  std::vector<Generation> gens = existing.generations;
  if (gens.empty()) {
    gens.push_back(GenerationOf(existing, existing.registered_by,
                                existing.registered_at_us));
  }
  std::vector<BindingOracle::GenerationHold> holds;
  if (BindingOracle* oracle = registry_->oracle()) {
    holds = oracle->GenerationHolds(existing.key);
  }
  std::map<uint32_t, std::vector<BindingOracle::GenerationHold>> held;
  for (const BindingOracle::GenerationHold& h : holds) {
    if (h.generation != 0 && h.generation != existing.generation) {
      held[h.generation].push_back(h);
    }
  }
  std::vector<Generation> kept;
  for (Generation& g : gens) {
    if (g.generation == existing.generation || held.count(g.generation)) {
      kept.push_back(std::move(g));
    }
  }
  // Holders of a generation no longer in the list run what they loaded;
  // they cannot keep it.
  for (auto it = held.begin(); it != held.end();) {
    bool listed = std::any_of(
        kept.begin(), kept.end(),
        [&](const Generation& g) { return g.generation == it->first; });
    it = listed ? std::next(it) : held.erase(it);
  }
  const uint64_t limit = limits_.max_generations;
  if (kept.size() + 1 <= limit) return kept;
  return absl::ResourceExhaustedError(absl::StrCat(
      "cannot replace ", Named(existing.key), ": it would have ",
      kept.size() + 1, " live generations, over max_generations_per_target (",
      limit, "). Generation ", existing.generation, " is the current one, and ",
      held.size(),
      held.size() == 1 ? " earlier generation is" : " earlier generations are",
      " still held or pinned by live processes: ", HeldText(held),
      ". A generation is dropped once no process holds or pins it: let those "
      "processes exit (or bind the name without a generation to follow the "
      "current one), then replace again; or ask the operator to raise "
      "max_generations_per_target."));
}

absl::Status Replacement::Probed(const TargetEntry& next,
                                 const HandlerInfo& info) {
  if (next.generations.size() < 2) return absl::OkStatus();
  const Generation& before = next.generations[next.generations.size() - 2];
  const HandlerInfo& was = before.handler_info;
  if (was.api_major == info.api_major && was.traits == info.traits) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot replace ", Named(next.key), " with function \"", next.func_name,
      "\" of module ", next.module_digest,
      ": its XLA FFI metadata is not compatible with generation ",
      before.generation, "'s (FFI API ", was.api_major, ".", was.api_minor,
      " -> ", info.api_major, ".", info.api_minor, ", traits ", was.traits,
      " -> ", info.traits,
      "); executables compiled against the current handler cannot call it. "
      "Build it against the same XLA FFI API major version with the same "
      "traits, or register it under a distinct target name."));
}

absl::Status Replacement::Committing(TargetEntry* entry,
                                     const TargetEntry* previous) {
  (void)previous;
  if (!entry->generations.empty()) {
    entry->generations.back().handler_info = entry->handler_info;
  }
  return absl::OkStatus();
}

absl::StatusOr<RegisterOutcome> Replacement::Change(const RegisterArgs& args,
                                                    const std::string& digest,
                                                    const std::string& cid,
                                                    const EntryPtr& existing) {
  // The generations to keep are decided before anything is stored.
  absl::StatusOr<std::vector<Generation>> live = LiveGenerations(*existing);
  if (!live.ok()) {
    registry_->CountRefusal();
    refused_.fetch_add(1);
    return live.status();
  }
  TargetEntry next = *existing;
  const size_t before = std::max<size_t>(existing->generations.size(), 1);
  const bool drops = live->size() < before;
  next.generations = *std::move(live);
  next.generation = existing->generation + 1;
  next.func_name = args.func_name;
  next.content_id = cid;
  next.module_digest = digest;
  next.module_size = args.module_bytes.size();
  next.origin = args.origin;
  next.handler_info = {};
  next.generations.push_back(GenerationOf(next, args.peer, NowMicros()));
  absl::StatusOr<EntryPtr> installed = registry_->Install(
      next, args.module_bytes, /*journal=*/true, existing.get());
  if (!installed.ok()) {
    refused_.fetch_add(1);
    return installed.status();
  }
  spdlog::info(
      "replaced {}: generation {} (content {}, module {}) -> {} (content {}, "
      "module {}) by uid {} pid {}; live generations {}",
      Named(args.key), existing->generation, existing->content_id,
      existing->module_digest, next.generation, cid, digest, args.peer.uid,
      args.peer.pid,
      absl::StrJoin((*installed)->generations, ", ",
                    [](std::string* s, const Generation& g) {
                      absl::StrAppend(s, g.generation);
                    }));
  // Dropped generations' modules leave the store once the key is released.
  if (drops) registry_->OweSweep();
  // Committed; the name stays reserved (the caller's Hold) until the live
  // holders here switched or replace_timeout passed. The other hosts'
  // acknowledgements are awaited after the hold (Finish).
  RegisterOutcome out{true, *installed, /*replaced=*/true};
  out.deadline = absl::Now() + limits_.timeout;
  if (Repointer* repointer = repointer_.load()) {
    out.laggards = repointer->Repoint(**installed, out.deadline);
  }
  return out;
}

absl::StatusOr<RegisterOutcome> Replacement::Finish(RegisterOutcome out) {
  if (!out.replaced) return out;
  PeerAcks peers;
  if (BindingAuthority* authority = authority_.load()) {
    peers = authority->AwaitPeerAcks(*out.entry, out.deadline + kPeerAckGrace);
  }
  out.laggards.insert(out.laggards.end(), peers.laggards.begin(),
                      peers.laggards.end());
  if (out.laggards.empty() && peers.hosts.empty()) {
    done_.fetch_add(1);
    return out;
  }
  timeout_.fetch_add(1);
  return absl::DeadlineExceededError(
      LaggardsMessage(*out.entry, out.laggards, peers.hosts, limits_.timeout));
}

std::string LaggardsMessage(const TargetEntry& entry,
                            const std::vector<Repointer::Laggard>& laggards,
                            const std::vector<PeerAcks::Host>& hosts,
                            absl::Duration timeout) {
  // A holder without a host is this kregd's client: on this host.
  char here[256] = {};
  ::gethostname(here, sizeof(here) - 1);
  std::set<uint32_t> behind;
  for (const Repointer::Laggard& l : laggards) behind.insert(l.generation);
  const std::string within = absl::StrCat(
      "within replace_timeout (", absl::ToDoubleSeconds(timeout), " s)");
  std::string out = absl::StrCat(Named(entry.key), " is now generation ",
                                 entry.generation, ", but ");
  if (!laggards.empty()) {
    absl::StrAppend(
        &out, "these processes did not switch to it ", within, ": ",
        absl::StrJoin(laggards, "; ",
                      [&](std::string* s, const Repointer::Laggard& l) {
                        absl::StrAppend(s, "pid ", l.peer.pid, " ",
                                        UserName(l.peer.uid), " host ",
                                        l.host.empty() ? here : l.host, " (",
                                        l.local ? "local" : "isolated",
                                        ", runs generation ", l.generation,
                                        l.why.empty() ? "" : ": ", l.why, ")");
                      }),
        ". They run generation",
        behind.size() == 1 ? absl::StrCat(" ", *behind.begin())
                           : absl::StrCat("s ", absl::StrJoin(behind, ", ")),
        " until they switch or exit; `kregctl show ", entry.key.name,
        "` shows what each runs. A stopped process (SIGSTOP) switches when it "
        "continues.");
  }
  if (hosts.empty()) return out;
  absl::StrAppend(
      &out, laggards.empty() ? "" : " Also: ",
      absl::StrJoin(
          hosts, "; ",
          [&](std::string* s, const PeerAcks::Host& h) {
            if (h.host.empty()) {
              absl::StrAppend(s,
                              "whether processes on the other hosts "
                              "switched is unknown: ",
                              h.why);
            } else if (h.why.empty()) {
              absl::StrAppend(s, "host ", h.host,
                              " did not report whether its processes "
                              "switched ",
                              within,
                              " (its kregd may be stopped, stuck or cut off "
                              "from etcd)");
            } else {
              absl::StrAppend(s, "host ", h.host,
                              " could not switch its processes: ", h.why);
            }
          }),
      ". `kregctl show ", entry.key.name,
      "` on a host shows what its processes run.");
  return out;
}

}  // namespace kreg
