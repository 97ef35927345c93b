#include "daemon/cluster/cluster_registry.h"

#include <unistd.h>

#include <chrono>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/version.h"
#include "daemon/cluster/cluster_records.h"
#include "daemon/cluster/module_exchange.h"
#include "daemon/target_proto.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

// Clients tell kregd's own UNAVAILABLE from an unreachable kregd by the
// words "the cluster registry".
absl::Status Unreachable(const absl::Status& st) {
  if (st.code() != absl::StatusCode::kUnavailable) return st;
  return absl::UnavailableError(absl::StrCat(
      "the cluster registry (etcd) is unreachable: ", st.message()));
}

bool SameBinding(const TargetEntry& a, const TargetEntry& b) {
  return a.kind == b.kind && a.content_id == b.content_id &&
         a.func_name == b.func_name && a.module_digest == b.module_digest;
}

}  // namespace

ClusterRegistry::ClusterRegistry(ClusterOptions options,
                                 const ModuleStore* store)
    : options_(std::move(options)),
      prefix_(absl::StrCat("/kregd/", options_.cluster, "/")),
      host_id_(absl::StrCat(options_.host_name, " (", options_.advertise, ")")),
      started_at_us_(NowMicros()),
      store_(store),
      etcd_(options_.etcd),
      peer_creds_(PeerChannelCredentials(options_.tls)) {}

ClusterRegistry::~ClusterRegistry() { Stop(); }

void ClusterRegistry::Start(Registry* registry) {
  registry_.store(registry);
  registry->SetBindingAuthority(this);
  spdlog::info(
      "cluster mode: cluster \"{}\" in etcd {}, this host {}, peers {}",
      options_.cluster, etcd_.endpoints_text(), host_id_,
      options_.tls.enabled ? "over TLS" : "in plaintext (no peer_tls_*)");
  watch_thread_ = std::thread([this] { WatchLoop(); });
  lease_thread_ = std::thread([this] { LeaseLoop(); });
}

void ClusterRegistry::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  etcd_.CancelWatches();
  if (watch_thread_.joinable()) watch_thread_.join();
  if (lease_thread_.joinable()) lease_thread_.join();
}

bool ClusterRegistry::Sleep(int64_t ms) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(ms));
  return !stopping_;
}

std::string ClusterRegistry::TargetKeyOf(const TargetKey& key) const {
  return BindingKey(prefix_, key);
}

absl::StatusOr<TargetEntry> ClusterRegistry::Parse(const EtcdKv& kv) const {
  return ParseBindingRecord(prefix_, kv.key, kv.value);
}

absl::StatusOr<ClaimResult> ClusterRegistry::Claim(
    const TargetEntry& proposed) {
  absl::StatusOr<EtcdCreate> created = etcd_.CreateIfAbsent(
      TargetKeyOf(proposed.key), RecordJson(ToProto(proposed)));
  if (!created.ok()) {
    if (created.status().code() != absl::StatusCode::kUnavailable &&
        created.status().code() != absl::StatusCode::kDeadlineExceeded) {
      return created.status();
    }
    return absl::UnavailableError(absl::StrCat(
        "cannot register ", Named(proposed.key),
        ": the cluster registry of "
        "cluster \"",
        options_.cluster, "\" is unreachable (", created.status().message(),
        "). In cluster mode a binding is made in etcd for every host or not "
        "at all; this host did not register it. Targets already registered "
        "keep working. Retry once etcd is back (check the etcd members and "
        "--etcd-endpoints); should etcd have applied this claim before its "
        "answer was lost, the retry is an idempotent no-op."));
  }
  ClaimResult out;
  out.created = created->created;
  if (out.created) {
    spdlog::info("cluster: claimed {} at etcd revision {}", Named(proposed.key),
                 created->revision);
    absl::MutexLock lock(&mu_);
    republish_ = true;
    return out;
  }
  absl::StatusOr<TargetEntry> existing = Parse(created->existing);
  if (!existing.ok()) return existing.status();
  out.existing = *std::move(existing);
  return out;
}

void ClusterRegistry::Unclaim(const TargetEntry& claimed) {
  const std::string key = TargetKeyOf(claimed.key);
  absl::StatusOr<EtcdRange> now = etcd_.Range(key, false);
  absl::Status st = now.status();
  if (st.ok() && now->kvs.size() == 1) {
    absl::StatusOr<TargetEntry> e = Parse(now->kvs[0]);
    if (e.ok() && SameBinding(*e, claimed) && e->host == host_id_) {
      st = etcd_.DeleteIfUnchanged(key, now->kvs[0].mod_revision).status();
    }
  }
  if (!st.ok()) {
    spdlog::error(
        "cluster: {} was claimed in etcd but not committed here, and the "
        "claim could not be taken back ({}); retire it (kregctl retire) once "
        "etcd answers",
        Named(claimed.key), std::string(st.message()));
  }
}

absl::Status ClusterRegistry::Release(const TargetEntry& entry) {
  const std::string key = TargetKeyOf(entry.key);
  absl::StatusOr<EtcdRange> now = etcd_.Range(key, false);
  if (!now.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "cannot retire ", Named(entry.key),
        ": the cluster registry is "
        "unreachable (",
        now.status().message(),
        "); a retirement is made in etcd for every host or not at all. Retry "
        "once etcd is back."));
  }
  if (now->kvs.empty()) return absl::OkStatus();  // gone already
  absl::StatusOr<TargetEntry> e = Parse(now->kvs[0]);
  if (e.ok() && !SameBinding(*e, entry)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot retire ", Named(entry.key),
        ": the cluster binding is now "
        "content ",
        e->content_id, " (host ", e->host, "), not this host's ",
        entry.content_id, "; this host catches up shortly, then retry"));
  }
  absl::StatusOr<bool> deleted =
      etcd_.DeleteIfUnchanged(key, now->kvs[0].mod_revision);
  if (!deleted.ok()) return deleted.status();
  if (!*deleted) {
    return absl::AbortedError(absl::StrCat(
        "cannot retire ", Named(entry.key),
        ": its cluster binding changed during the retirement; retry"));
  }
  absl::MutexLock lock(&mu_);
  republish_ = true;
  return absl::OkStatus();
}

bool ClusterRegistry::Holds(const std::string& digest) const {
  Registry* r = registry_.load();
  if (r == nullptr) return false;
  for (const EntryPtr& e : r->List()) {
    if (e->module_digest == digest && e->unavailable.empty()) return true;
  }
  return false;
}

std::string ClusterRegistry::HostRecord() const {
  v1::ClusterHost h;
  h.set_address(options_.advertise);
  h.set_host_name(options_.host_name);
  h.set_version(kKregVersion);
  h.set_pid(::getpid());
  h.set_started_at_us(started_at_us_);
  std::set<std::string> held;
  if (Registry* r = registry_.load()) {
    for (const EntryPtr& e : r->List()) {
      if (!e->module_digest.empty() && e->unavailable.empty()) {
        held.insert(e->module_digest);
      }
    }
  }
  for (const std::string& d : held) h.add_modules(d);
  return RecordJson(h);
}

absl::StatusOr<std::string> ClusterRegistry::FetchModule(
    const std::string& digest, uint64_t size) {
  if (size > options_.max_module_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "module ", digest, " is bound in etcd with a size of ", size,
        " bytes, more than this kregd's max_module_bytes (",
        options_.max_module_bytes,
        "); not fetched. Raise max_module_bytes on this host if the module "
        "is legitimate"));
  }
  absl::StatusOr<EtcdRange> peers = etcd_.Range(prefix_ + "peers/", true);
  if (!peers.ok()) return peers.status();
  std::vector<std::string> first, then;
  for (const EtcdKv& kv : peers->kvs) {
    absl::StatusOr<v1::ClusterHost> h = ParseHostRecord(kv.value);
    if (!h.ok()) {
      spdlog::warn("cluster: etcd key {} ignored: {}", kv.key.substr(0, 200),
                   std::string(h.status().message()));
      continue;
    }
    if (h->address() == options_.advertise) continue;
    bool has = false;
    for (const std::string& d : h->modules()) has = has || d == digest;
    (has ? first : then).push_back(h->address());
  }
  first.insert(first.end(), then.begin(), then.end());
  if (first.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "no other kregd of cluster \"", options_.cluster,
        "\" is advertised in etcd to fetch module ", digest, " from"));
  }
  std::vector<std::string> errors;
  bool data_loss = false, all_not_found = true;
  for (const std::string& address : first) {
    absl::StatusOr<std::string> bytes = FetchModuleFrom(
        address, digest, size, peer_creds_, options_.fetch_timeout_ms);
    if (bytes.ok()) {
      spdlog::info("cluster: fetched module {} ({} bytes) from peer {}", digest,
                   bytes->size(), address);
      return bytes;
    }
    data_loss =
        data_loss || bytes.status().code() == absl::StatusCode::kDataLoss;
    all_not_found =
        all_not_found && bytes.status().code() == absl::StatusCode::kNotFound;
    spdlog::warn("cluster: fetching module {}: {}", digest,
                 std::string(bytes.status().message()));
    errors.push_back(std::string(bytes.status().message()));
  }
  std::string msg = absl::StrCat("no peer served module ", digest, " (",
                                 absl::StrJoin(errors, "; "), ")");
  if (data_loss) return absl::DataLossError(msg);
  if (all_not_found) return absl::NotFoundError(msg);
  return absl::UnavailableError(msg);
}

void ClusterRegistry::Apply(const TargetEntry& binding, bool may_fetch) {
  Registry* r = registry_.load();
  std::string bytes;
  if (binding.kind == TargetKind::kModule &&
      !store_->Verify(binding.module_digest).ok()) {
    if (!may_fetch) return;
    // The registering host commits its copy just after claiming: give it
    // a moment before concluding that nobody serves the module.
    absl::StatusOr<std::string> got;
    for (int64_t wait_ms = 100; wait_ms <= 6400; wait_ms *= 2) {
      got = FetchModule(binding.module_digest, binding.module_size);
      if (got.ok() || got.status().code() == absl::StatusCode::kDataLoss ||
          got.status().code() == absl::StatusCode::kResourceExhausted ||
          !Sleep(wait_ms)) {
        break;
      }
    }
    if (!got.ok()) {
      spdlog::warn(
          "cluster: {} is bound cluster-wide (host {}, module {}) but this "
          "host could not fetch its module: {}; it is not runnable here "
          "until it can",
          Named(binding.key), binding.host, binding.module_digest,
          std::string(got.status().message()));
      return;
    }
    bytes = *std::move(got);
  }
  absl::Status st = r->Mirror(binding, bytes);
  if (!st.ok()) {
    spdlog::error("cluster: cannot bind {} as on host {}: {}",
                  Named(binding.key), binding.host, std::string(st.message()));
  }
  absl::MutexLock lock(&mu_);
  republish_ = true;
}

absl::Status ClusterRegistry::Reconcile(int64_t* revision) {
  Registry* r = registry_.load();
  std::vector<EntryPtr> before = r->List();
  absl::StatusOr<EtcdRange> all = etcd_.Range(prefix_ + "targets/", true);
  if (!all.ok()) return all.status();
  std::set<TargetKey> bound;
  for (const EtcdKv& kv : all->kvs) {
    absl::StatusOr<TargetEntry> b = Parse(kv);
    if (!b.ok()) {
      spdlog::error("cluster: {}", std::string(b.status().message()));
      continue;
    }
    bound.insert(b->key);
    Apply(*b, /*may_fetch=*/true);
  }
  for (const EntryPtr& e : before) {
    if (bound.count(e->key) != 0) continue;
    absl::Status st = r->Unmirror(
        *e,
        "it is not bound in the cluster registry (retired on another host "
        "while this kregd was away, or registered before it joined the "
        "cluster); register it again to bind it cluster-wide");
    if (!st.ok()) spdlog::error("cluster: {}", std::string(st.message()));
  }
  *revision = all->revision;
  spdlog::info("cluster: in sync with etcd at revision {} ({} bindings)",
               all->revision, all->kvs.size());
  return absl::OkStatus();
}

void ClusterRegistry::WatchLoop() {
  int64_t revision = 0;
  bool synced = false, failing = false;
  int64_t backoff_ms = 200;
  auto on_event = [this](const EtcdEvent& ev) {
    if (ev.deleted) {
      if (ev.prev.value.empty()) return;
      absl::StatusOr<TargetEntry> gone = Parse(ev.prev);
      if (!gone.ok()) return;
      absl::Status st = registry_.load()->Unmirror(
          *gone, "retired cluster-wide (kregctl retire on some host)");
      if (!st.ok()) spdlog::error("cluster: {}", std::string(st.message()));
      absl::MutexLock lock(&mu_);
      republish_ = true;
      return;
    }
    absl::StatusOr<TargetEntry> b = Parse(ev.kv);
    if (!b.ok()) {
      spdlog::error("cluster: {}", std::string(b.status().message()));
      return;
    }
    // Made here: committed by the registration itself, unless etcd applied
    // a claim whose answer was lost (then bind it if the module is here).
    Apply(*b, /*may_fetch=*/b->host != host_id_);
  };
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    absl::Status st;
    if (!synced) {
      st = Reconcile(&revision);
      synced = st.ok();
    } else {
      int64_t last = revision;
      st = etcd_.Watch(prefix_ + "targets/", revision + 1, on_event, &last);
      revision = last;
      if (st.code() == absl::StatusCode::kCancelled) return;
      if (st.code() == absl::StatusCode::kOutOfRange) synced = false;
    }
    if (st.ok()) {
      if (failing) spdlog::info("cluster: etcd answers again");
      failing = false;
      backoff_ms = 200;
      continue;
    }
    if (!failing) {
      spdlog::warn(
          "cluster: lost etcd ({}); known targets keep working, new "
          "registrations fail until it is back",
          std::string(st.message()));
    }
    failing = true;
    if (!Sleep(backoff_ms)) return;
    backoff_ms = std::min<int64_t>(backoff_ms * 2, 3000);
  }
}

void ClusterRegistry::LeaseLoop() {
  const std::string key = prefix_ + "peers/" + options_.advertise;
  int64_t lease = 0;
  std::string published;
  bool warned = false;
  while (true) {
    absl::Status st;
    if (lease == 0) {
      absl::StatusOr<int64_t> granted = etcd_.GrantLease(options_.lease_ttl_s);
      st = granted.status();
      if (granted.ok()) {
        lease = *granted;
        published.clear();
      }
    }
    if (lease != 0) {
      std::string record = HostRecord();
      if (record != published) {
        st = etcd_.Put(key, record, lease);
        if (st.ok()) published = record;
      }
      if (st.ok()) {
        absl::StatusOr<int64_t> ttl = etcd_.KeepAlive(lease);
        st = ttl.status();
        if (st.code() == absl::StatusCode::kNotFound) lease = 0;
      }
    }
    if (!st.ok() && !warned) {
      spdlog::warn("cluster: cannot advertise this host in etcd: {}",
                   std::string(st.message()));
    }
    if (st.ok() && warned) {
      spdlog::info("cluster: advertised as {} (lease {:x})", key, lease);
    }
    warned = !st.ok();
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(
        absl::Condition(this, &ClusterRegistry::Woken),
        absl::Milliseconds(st.ok() ? options_.lease_ttl_s * 1000 / 3 : 1000));
    republish_ = false;
    if (stopping_) break;
  }
  if (lease != 0) (void)etcd_.Revoke(lease);  // peers stop asking at once
}

absl::StatusOr<v1::ListClusterTargetsResponse> ClusterRegistry::ListTargets() {
  absl::StatusOr<EtcdRange> all = etcd_.Range(prefix_ + "targets/", true);
  if (!all.ok()) return Unreachable(all.status());
  v1::ListClusterTargetsResponse out;
  out.set_cluster(options_.cluster);
  out.set_revision(all->revision);
  for (const EtcdKv& kv : all->kvs) {
    absl::StatusOr<TargetEntry> b = Parse(kv);
    if (b.ok()) *out.add_targets() = ToProto(*b);
  }
  return out;
}

absl::StatusOr<v1::ListHostsResponse> ClusterRegistry::ListHosts() {
  absl::StatusOr<EtcdRange> all = etcd_.Range(prefix_ + "peers/", true);
  if (!all.ok()) return Unreachable(all.status());
  v1::ListHostsResponse out;
  out.set_cluster(options_.cluster);
  for (const EtcdKv& kv : all->kvs) {
    v1::ClusterHost* h = out.add_hosts();
    if (!RecordFromJson(kv.value, h))
      h->set_address(kv.key.substr(prefix_.size()));
    h->set_lease_id(kv.lease);
    absl::StatusOr<int64_t> ttl = etcd_.TimeToLive(kv.lease);
    h->set_lease_ttl_s(ttl.ok() ? *ttl : -1);
    h->set_self(h->address() == options_.advertise);
  }
  return out;
}

}  // namespace kreg
