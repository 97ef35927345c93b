// kregd's metrics part (parts.h) and launch statistics: the Prometheus
// endpoint (docs/operator-guide.md "Watching it"). kregd runs no kernel: the
// executors count calls in their status pages and the pool folds them (and
// those of reaped executors) into per-target totals; this file matches them to
// registered targets.
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "daemon/api/session_server.h"
#include "daemon/base/platform_table.h"
#include "daemon/base/target_stats.h"
#include "daemon/base/uid_account.h"
#include "daemon/compile_service/compile_service.h"
#include "daemon/kregd/parts.h"
#include "daemon/metrics/http_server.h"
#include "daemon/metrics/process_stats.h"
#include "daemon/metrics/prometheus_text.h"
#include "daemon/registry/target_proto.h"
#include "daemon/supervisor/executor_pool.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

// The rows of the targets registered now, each generation's (a retired
// registration's calls no longer count under its name), in `rows`' order.
std::vector<TargetStatsRow> Current(const std::vector<EntryPtr>& entries,
                                    const std::vector<TargetStatsRow>& rows) {
  std::map<TargetKey, int64_t> registered_at;
  for (const EntryPtr& e : entries) registered_at[e->key] = e->registered_at_us;
  std::vector<TargetStatsRow> out;
  for (const TargetStatsRow& r : rows) {
    auto it = registered_at.find(r.entry->key);
    if (it != registered_at.end() && it->second == r.entry->registered_at_us) {
      out.push_back(r);
    }
  }
  return out;
}

// Whether generation `g` of `e`'s registration is live (docs/replace.md
// section 2): the current one, or one the entry still lists.
bool LiveGeneration(const TargetEntry& e, uint32_t g) {
  if (g == e.generation) return true;
  for (const Generation& live : e.generations) {
    if (live.generation == g) return true;
  }
  return false;
}

// Splits `rows` (Current's) into the live generations' (`live`) and those
// of generations a replacement dropped (`dropped`): the metrics have series
// for live generations only; kregctl's totals count them all.
void SplitDropped(const std::vector<EntryPtr>& entries,
                  const std::vector<TargetStatsRow>& rows,
                  std::vector<TargetStatsRow>* live,
                  std::vector<TargetStatsRow>* dropped) {
  std::map<TargetKey, const TargetEntry*> now;
  for (const EntryPtr& e : entries) now[e->key] = e.get();
  for (const TargetStatsRow& r : rows) {
    auto it = now.find(r.entry->key);
    const bool is_live =
        it == now.end() || LiveGeneration(*it->second, r.entry->generation);
    (is_live ? live : dropped)->push_back(r);
  }
}

// `rows` (Current's) summed per target.
std::map<TargetKey, TargetStats> PerTarget(
    const std::vector<TargetStatsRow>& rows) {
  std::map<TargetKey, TargetStats> out;
  for (const TargetStatsRow& r : rows) out[r.entry->key].Add(r.stats);
  return out;
}

// kregd_build_info, kregd_uptime_seconds and the standard process_*
// families (operator guide, "Metrics").
void WriteDaemonFamilies(std::chrono::steady_clock::time_point started,
                         PromWriter* w) {
  w->Family("kregd_build_info", "gauge", "kregd's version (always 1)");
  w->Sample("kregd_build_info", {{"version", kKregVersion}}, uint64_t{1});
  w->Family("kregd_uptime_seconds", "gauge", "seconds since kregd started");
  w->Sample(
      "kregd_uptime_seconds", {},
      static_cast<double>(std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::steady_clock::now() - started)
                              .count()) /
          1000);
  if (absl::StatusOr<ProcessStats> ps = ReadProcessStats(); ps.ok()) {
    WriteProcessStats(*ps, w);
  } else {
    spdlog::warn("metrics: process_* left out: {}",
                 std::string(ps.status().message()));
  }
}

// The compile service's counters (DESIGN §13).
void WriteCompileFamilies(const CompileCounts& cc, PromWriter* w) {
  w->Family("kregd_compiles_total", "counter",
            "compiles run by the compile service (concurrent requests for "
            "one cache key share one)");
  w->Sample("kregd_compiles_total", {}, cc.compiles);
  w->Family("kregd_compile_requests_total", "counter",
            "CompileTarget requests, by outcome: cache_hit (no compile "
            "needed), waited (shared another request's compile), failed, "
            "queue_full (refused by a compile queue limit), abandoned (the "
            "caller went away first)");
  w->Sample("kregd_compile_requests_total", {{"outcome", "cache_hit"}},
            cc.cache_hits);
  w->Sample("kregd_compile_requests_total", {{"outcome", "waited"}}, cc.waits);
  w->Sample("kregd_compile_requests_total", {{"outcome", "failed"}},
            cc.failures);
  w->Sample("kregd_compile_requests_total", {{"outcome", "queue_full"}},
            cc.queue_refusals);
  w->Sample("kregd_compile_requests_total", {{"outcome", "abandoned"}},
            cc.abandoned);
}

// The registry and the module store: targets per platform, registrations
// by outcome and refusal reason, the store files registered targets use.
void WriteRegistryFamilies(const std::vector<EntryPtr>& entries,
                           const RegistrationCounts& reg, PromWriter* w) {
  std::map<std::string, uint64_t> per_platform;
  for (Platform p : AllPlatforms()) per_platform[PlatformName(p)] = 0;
  std::map<std::string, uint64_t> modules;  // digest -> size
  for (const EntryPtr& e : entries) {
    per_platform[PlatformName(e->key.platform)]++;
    if (!e->module_digest.empty()) modules[e->module_digest] = e->module_size;
  }
  w->Family("kregd_targets", "gauge", "registered targets");
  for (const auto& [platform, n] : per_platform) {
    w->Sample("kregd_targets", {{"platform", platform}}, n);
  }
  w->Family("kregd_registrations_total", "counter",
            "registrations accepted: outcome=\"created\" (a new binding) or "
            "\"noop\" (identical to the registered entry)");
  w->Sample("kregd_registrations_total", {{"outcome", "created"}}, reg.created);
  w->Sample("kregd_registrations_total", {{"outcome", "noop"}}, reg.noop);
  w->Family("kregd_registrations_refused_total", "counter",
            "registrations refused, by reason: conflict (the name is bound "
            "to other content), invalid, quota, permission, unavailable, "
            "other");
  for (int i = 0; i < kNumRefusalReasons; ++i) {
    w->Sample("kregd_registrations_refused_total",
              {{"reason", RefusalReasonName(static_cast<RefusalReason>(i))}},
              reg.refused[i]);
  }
  uint64_t store_bytes = 0;
  for (const auto& [digest, size] : modules) store_bytes += size;
  w->Family("kregd_modules", "gauge",
            "distinct module store files registered targets use");
  w->Sample("kregd_modules", {}, static_cast<uint64_t>(modules.size()));
  w->Family("kregd_store_bytes", "gauge",
            "bytes of the module store files registered targets use");
  w->Sample("kregd_store_bytes", {}, store_bytes);
}

// Replacements under replace = "owner" (docs/replace.md), by outcome.
void WriteReplaceFamily(const ReplaceCounts& n, PromWriter* w) {
  w->Family("kregd_replaces_total", "counter",
            "replacements (replace=true with other content): outcome=\"done\" "
            "(every live holder switched), \"timeout\" (some did not within "
            "replace_timeout; the generation is committed) or \"refused\"");
  w->Sample("kregd_replaces_total", {{"outcome", "done"}}, n.done);
  w->Sample("kregd_replaces_total", {{"outcome", "timeout"}}, n.timeout);
  w->Sample("kregd_replaces_total", {{"outcome", "refused"}}, n.refused);
}

// The open sessions: `open` from the session server, `bound` those bound
// to an executor (per uid, arena bytes), and the local-execution figures.
void WriteSessionFamilies(uint64_t open, const std::vector<BoundSession>& bound,
                          uint64_t local_binds, uint64_t local_sessions,
                          PromWriter* w) {
  w->Family("kregd_sessions", "gauge", "open client sessions");
  w->Sample("kregd_sessions", {}, open);
  std::map<uid_t, uint64_t> per_uid;
  uint64_t arena_bytes = 0;
  uint64_t states = 0;
  for (const BoundSession& s : bound) {
    per_uid[s.peer.uid]++;
    arena_bytes = SaturatingAdd(arena_bytes, s.arena_bytes);
    states = SaturatingAdd(states, s.states);
  }
  w->Family("kregd_local_binds_total", "counter",
            "targets bound for local execution, once per target and session "
            "(DESIGN §11)");
  w->Sample("kregd_local_binds_total", {}, local_binds);
  w->Family("kregd_local_sessions", "gauge",
            "client sessions that hold at least one target locally");
  w->Sample("kregd_local_sessions", {}, local_sessions);
  w->Family("kregd_sessions_by_uid", "gauge",
            "client sessions bound to an executor, per client uid");
  for (const auto& [uid, n] : per_uid) {
    w->Sample("kregd_sessions_by_uid", {{"uid", absl::StrCat(uid)}}, n);
  }
  w->Family("kregd_shared_arena_bytes", "gauge",
            "bytes of the shared-memory arenas of the open sessions");
  w->Sample("kregd_shared_arena_bytes", {}, arena_bytes);
  w->Family("kregd_handler_states", "gauge",
            "call-site states (handler bundles' instantiate stage) the "
            "executors hold for the open sessions");
  w->Sample("kregd_handler_states", {}, states);
}

// The executor pool's counters; `executors` are the running ones.
void WriteExecutorFamilies(const PoolCounters& c, uint64_t executors,
                           const std::string& isolation, PromWriter* w) {
  w->Family("kregd_executors", "gauge", "running executor processes");
  w->Sample("kregd_executors", {{"isolation", isolation}}, executors);
  w->Family("kregd_executors_started_total", "counter",
            "executor processes started");
  w->Sample("kregd_executors_started_total", {}, c.executors_started);
  w->Family("kregd_executor_crashes_total", "counter",
            "executor deaths during a call (per target and caller uid)");
  w->Sample("kregd_executor_crashes_total", {}, c.executor_crashes);
  w->Family("kregd_broker_messages_refused_total", "counter",
            "executor messages to kregd refused unread (over the size "
            "limit); each ended its session");
  w->Sample("kregd_broker_messages_refused_total", {},
            c.broker_messages_refused);
  w->Family("kregd_launches_total", "counter",
            "launches received by the executors (all targets, including "
            "ones refused before a handler ran)");
  w->Sample("kregd_launches_total", {}, c.launches);
  w->Family("kregd_launch_errors_total", "counter",
            "launches that failed (all targets)");
  w->Sample("kregd_launch_errors_total", {}, c.launch_errors);
}

// The rows of retired targets. A name registered again after its
// retirement has one set of series, the new registration's, so a retired
// row whose (name, platform) is registered now is left out.
std::vector<TargetStatsRow> RetiredStats(
    const std::vector<EntryPtr>& entries,
    const std::vector<TargetStatsRow>& rows) {
  std::set<TargetKey> registered;
  for (const EntryPtr& e : entries) registered.insert(e->key);
  std::vector<TargetStatsRow> retired;
  for (const TargetStatsRow& r : rows) {
    if (registered.count(r.entry->key) == 0) retired.push_back(r);
  }
  return retired;
}

// The per-target families: launches, errors and the latency histogram, per
// generation (docs/replace.md section 8; "1" for a target never replaced).
void WriteTargetFamilies(const std::vector<TargetStatsRow>& stats,
                         PromWriter* w) {
  auto labels = [](const TargetEntry& e) {
    return PromLabels{{"target", e.key.name},
                      {"platform", PlatformName(e.key.platform)},
                      {"generation", absl::StrCat(e.generation)}};
  };
  w->Family("kregd_target_launches_total", "counter",
            "handler calls of a target's generation");
  for (const auto& [e, s] : stats) {
    w->Sample("kregd_target_launches_total", labels(*e), s.launches);
  }
  w->Family("kregd_target_launch_errors_total", "counter",
            "handler calls of a target's generation that returned an error");
  for (const auto& [e, s] : stats) {
    w->Sample("kregd_target_launch_errors_total", labels(*e), s.errors);
  }
  w->Family("kregd_target_launch_duration_seconds", "histogram",
            "handler call latency of a target's generation in its executor "
            "(CUDA: host time to enqueue)");
  for (const auto& [e, s] : stats) {
    uint64_t cumulative = 0;
    for (int i = 0; i < kLatencyBuckets; ++i) {
      cumulative = SaturatingAdd(cumulative, s.buckets[i]);
      PromLabels l = labels(*e);
      l.emplace_back(
          "le", i < kLatencyBounds
                    ? PromNumber(static_cast<double>(kLatencyBoundNs[i]) / 1e9)
                    : "+Inf");
      w->Sample("kregd_target_launch_duration_seconds_bucket", l, cumulative);
    }
    w->Sample("kregd_target_launch_duration_seconds_sum", labels(*e),
              static_cast<double>(s.sum_ns) / 1e9);
    w->Sample("kregd_target_launch_duration_seconds_count", labels(*e),
              cumulative);
  }
}

}  // namespace

MetricsPart::MetricsPart(DaemonCore* core, const CompilePart* compile,
                         const SessionsPart* sessions)
    : core_(core),
      config_(core->config),
      compile_(compile),
      sessions_(sessions) {}

MetricsPart::~MetricsPart() = default;

absl::Status MetricsPart::Start() {
  if (config_.metrics_listen.empty()) return absl::OkStatus();
  KREG_ASSIGN_OR_RETURN(MetricsAddress address,
                        ParseMetricsAddress(config_.metrics_listen,
                                            config_.metrics_allow_remote));
  MetricsServerOptions options;
  options.socket_gid = core_->gid;
  KREG_ASSIGN_OR_RETURN(server_,
                        MetricsServer::Start(
                            address, [this] { return Render(); }, options));
  spdlog::info("metrics: serving http://{}/metrics", server_->address());
  return absl::OkStatus();
}

void MetricsPart::Stop() { server_.reset(); }

std::vector<v1::TargetStats> CurrentTargetStats(
    ExecutorPool* pool, const std::vector<EntryPtr>& entries) {
  std::vector<v1::TargetStats> out;
  if (pool == nullptr) return out;
  for (const auto& [key, s] :
       PerTarget(Current(entries, pool->TargetStatsSnapshot()))) {
    out.push_back(StatsToProto(key, s));
  }
  return out;
}

void StatsOf(ExecutorPool* pool, const TargetEntry& entry, v1::Target* t) {
  std::vector<TargetStatsRow> rows;
  if (pool != nullptr) rows = pool->TargetStatsSnapshot();
  TargetStats total;
  for (const TargetStatsRow& r : rows) {
    if (!(r.entry->key == entry.key &&
          r.entry->registered_at_us == entry.registered_at_us)) {
      continue;  // another target, or a retired registration of its name
    }
    total.Add(r.stats);  // dropped generations' calls too
    if (!entry.generations.empty() &&
        LiveGeneration(entry, r.entry->generation)) {
      v1::TargetStats* g = t->add_generation_stats();
      *g = StatsToProto(entry.key, r.stats);
      g->set_generation(r.entry->generation);
    }
  }
  *t->mutable_stats() = StatsToProto(entry.key, total);
}

std::string MetricsPart::Render() {
  ExecutorPool* const pool = sessions_->pool();
  PromWriter w;
  WriteDaemonFamilies(core_->started, &w);
  const std::vector<EntryPtr> entries = core_->registry.List();
  WriteRegistryFamilies(entries, core_->registrar.counts(), &w);
  WriteReplaceFamily(core_->registry.replaces(), &w);
  if (compile_->service() != nullptr) {
    WriteCompileFamilies(compile_->service()->counts(), &w);
  }

  std::vector<BoundSession> sessions;
  if (pool != nullptr) sessions = pool->Sessions();
  WriteSessionFamilies(static_cast<uint64_t>(sessions_->open_sessions()),
                       sessions, core_->local_binds.load(),
                       static_cast<uint64_t>(core_->bindings.LocalSessions()),
                       &w);
  if (pool != nullptr) {
    PoolCounters c = pool->counters();
    WriteExecutorFamilies(c, static_cast<uint64_t>(pool->List().size()),
                          config_.isolation, &w);
  }
  w.Family("kregd_uid_held", "gauge",
           "what each uid holds now of a per-uid limit (operator guide, "
           "\"Per-uid limits\"); only uids holding something");
  for (const UidAccount::Holding& h : core_->account.Snapshot()) {
    w.Sample(
        "kregd_uid_held",
        {{"uid", absl::StrCat(h.uid)}, {"resource", InfoOf(h.resource).label}},
        h.held);
  }
  uint64_t quarantined = 0;
  for (const CrashRecord& row : core_->ledger.Rows())
    quarantined += row.quarantined;
  w.Family("kregd_quarantined_targets", "gauge",
           "(target, caller uid) pairs quarantined after repeated crashes");
  w.Sample("kregd_quarantined_targets", {}, quarantined);

  // Per target generation: the live ones, and each retired (or dropped:
  // docs/replace.md section 2) one a last time with its final values, so
  // that a scrape sees where its counters ended before the series vanish
  // (operator guide, "Metrics").
  std::vector<TargetStatsRow> stats;
  if (pool != nullptr) {
    std::vector<TargetStatsRow> rows = pool->TargetStatsSnapshot();
    std::vector<TargetStatsRow> retired = RetiredStats(entries, rows);
    SplitDropped(entries, Current(entries, rows), &stats, &retired);
    std::set<GenerationId> now;
    for (const TargetStatsRow& r : retired) now.insert(GenerationId(*r.entry));
    absl::MutexLock lock(&mu_);
    for (auto it = retired_shown_.begin(); it != retired_shown_.end();) {
      it = now.count(*it) ? std::next(it) : retired_shown_.erase(it);
    }
    for (const TargetStatsRow& r : retired) {
      if (retired_shown_.insert(GenerationId(*r.entry)).second) {
        stats.push_back(r);
      }
    }
  }
  WriteTargetFamilies(stats, &w);
  return w.text();
}

}  // namespace kreg
