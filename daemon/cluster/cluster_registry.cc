#include "daemon/cluster/cluster_registry.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "daemon/base/log_limit.h"
#include "daemon/cluster/cluster_records.h"
#include "daemon/cluster/fetch_tree.h"
#include "daemon/cluster/module_exchange.h"
#include "daemon/registry/target_proto.h"
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

// Where `kv` sits in its key's history: what its record must be signed for.
RecordPlace PlaceOf(const EtcdKv& kv) {
  return {kv.create_revision, kv.version};
}

// When `entry`'s generation was made: with the generation, what an
// acknowledgement names (a retired and registered again name counts its
// generations anew).
int64_t MadeAt(const TargetEntry& entry) {
  return entry.generations.empty() ? 0 : entry.generations.back().at_us;
}

// "NAME (ADDRESS)", as HostName() names a host; the name (from an unsigned
// host record) only when it is a plain host name.
std::string PeerName(const v1::ClusterHost& h) {
  const std::string& name = h.host_name();
  const bool plain =
      !name.empty() && name.size() <= 64 &&
      name.find_first_not_of(
          "abcdefghijklmnopqrstuvwxyz"
          "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_") == std::string::npos;
  return absl::StrCat(plain ? name : "?", " (", h.address(), ")");
}

// The ADDRESS of a host named "NAME (ADDRESS)" (TargetEntry::host).
std::string AddressOf(const std::string& host) {
  const size_t open = host.rfind(" (");
  if (open == std::string::npos || host.empty() || host.back() != ')') {
    return "";
  }
  return host.substr(open + 2, host.size() - open - 3);
}

}  // namespace

ClusterRegistry::ClusterRegistry(ClusterOptions options,
                                 const ModuleStore* store)
    : options_(std::move(options)),
      prefix_(absl::StrCat("/kregd/", options_.cluster, "/")),
      host_id_(absl::StrCat(options_.host_name, " (", options_.advertise, ")")),
      started_at_us_(NowMicros()),
      store_(store),
      signer_(options_.key),
      etcd_(options_.etcd),
      peer_creds_(PeerChannelCredentials(options_.tls)) {}

ClusterRegistry::~ClusterRegistry() { Stop(); }

void ClusterRegistry::Start(ClusterMirror* mirror) {
  registry_.store(mirror);
  spdlog::info(
      "cluster mode: cluster \"{}\" in etcd {}, this host {}, peers {}",
      options_.cluster, etcd_.endpoints_text(), host_id_,
      options_.tls.enabled ? "over TLS" : "in plaintext (no peer_tls_*)");
  watch_thread_ = std::thread([this] { WatchLoop(); });
  lease_thread_ = std::thread([this] { LeaseLoop(); });
  retry_thread_ = std::thread([this] { RetryLoop(); });
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
  if (retry_thread_.joinable()) retry_thread_.join();
}

bool ClusterRegistry::Sleep(int64_t ms) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(ms));
  return !stopping_;
}

absl::StatusOr<BindingRecord> ClusterRegistry::Parse(const EtcdKv& kv) const {
  return ParseSignedBinding(signer_, prefix_, kv.key, kv.value, PlaceOf(kv));
}

void ClusterRegistry::Ignored(const absl::Status& why) {
  if (why.code() == absl::StatusCode::kNotFound) return;  // not sealed yet
  std::string more;
  if (PeerLogLimiter().Allow("etcd records", &more)) {
    spdlog::error(
        "cluster: ignored what etcd holds: {}; no binding changed "
        "here for it{}",
        std::string(why.message()), more);
  }
}

absl::StatusOr<bool> ClusterRegistry::WriteAfter(const std::string& key,
                                                 const std::string& kind,
                                                 const std::string& body,
                                                 const EtcdKv* now,
                                                 int64_t lease) {
  if (now != nullptr && now->create_revision != 0) {
    // The guard pins the key's create_revision and version: this write is
    // its next version of the same incarnation.
    return etcd_.PutIfUnchanged(
        key,
        signer_.Sign(key, kind, body, {now->create_revision, now->version + 1}),
        now->mod_revision, lease);
  }
  // A key's create_revision is known only once it is created: the
  // creating write is a claim that counts once the next write seals it.
  KREG_ASSIGN_OR_RETURN(
      EtcdCreate c,
      etcd_.CreateIfAbsent(key, signer_.Sign(key, kind, body, kCreatingWrite),
                           lease));
  if (!c.created) return false;
  return etcd_.PutIfUnchanged(
      key, signer_.Sign(key, kind, body, {c.revision, 2}), c.revision, lease);
}

absl::Status ClusterRegistry::WriteSigned(const std::string& key,
                                          const std::string& kind,
                                          const std::string& body,
                                          int64_t lease) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    KREG_ASSIGN_OR_RETURN(EtcdRange now, etcd_.Range(key, false));
    KREG_ASSIGN_OR_RETURN(
        bool written,
        WriteAfter(key, kind, body, now.kvs.empty() ? nullptr : &now.kvs[0],
                   lease));
    if (written) return absl::OkStatus();
  }
  return absl::AbortedError(
      absl::StrCat("etcd key \"", key.substr(0, 200),
                   "\" kept changing while this kregd wrote it; retry"));
}

void ClusterRegistry::PutBack(const EtcdKv& prev) {
  absl::StatusOr<SignedRecord> record =
      signer_.Verify(prev.key, prev.value, PlaceOf(prev));
  if (!record.ok()) return;  // not the cluster's: nothing to put back
  for (int attempt = 0; attempt < 3; ++attempt) {
    absl::StatusOr<EtcdRange> now = etcd_.Range(prev.key, false);
    if (!now.ok()) break;
    const EtcdKv* held = now->kvs.empty() ? nullptr : &now->kvs[0];
    if (held != nullptr &&
        signer_.Verify(held->key, held->value, PlaceOf(*held)).ok()) {
      return;  // a kregd wrote it meanwhile (another host put it back)
    }
    absl::StatusOr<bool> written =
        WriteAfter(prev.key, record->kind, record->body, held, 0);
    if (!written.ok()) break;
    if (*written) {
      spdlog::warn(
          "cluster: put the {} record of etcd key \"{}\" back (version {} "
          "of the key as created at revision {}), which a write without the "
          "cluster key had removed or replaced",
          record->kind, prev.key.substr(0, 200), prev.version,
          prev.create_revision);
      return;
    }
  }
  spdlog::error(
      "cluster: could not put the {} record of etcd key \"{}\" back; hosts "
      "that start now do not see it until it is registered again",
      record->kind, prev.key.substr(0, 200));
}

absl::StatusOr<ClaimResult> ClusterRegistry::Claim(
    const TargetEntry& proposed) {
  const std::string key = BindingKey(prefix_, proposed.key);
  const std::string body = RecordJson(ToProto(proposed));
  auto unreachable = [&](const absl::Status& st) {
    if (st.code() != absl::StatusCode::kUnavailable &&
        st.code() != absl::StatusCode::kDeadlineExceeded) {
      return st;
    }
    return absl::UnavailableError(absl::StrCat(
        "cannot register ", Named(proposed.key),
        ": the cluster registry of cluster \"", options_.cluster,
        "\" is unreachable (", st.message(),
        "). In cluster mode a binding is made in etcd for every host or not "
        "at all; this host did not register it. Targets already registered "
        "keep working. Retry once etcd is back (check the etcd members and "
        "--etcd-endpoints); should etcd have applied this claim before its "
        "answer was lost, the retry is an idempotent no-op."));
  };
  ClaimResult out;
  // Another host's claim not sealed yet (its mod_revision) and since when
  // this host sees it.
  int64_t unsealed = 0;
  absl::Time unsealed_since;
  for (int attempt = 0; attempt < 5 && !out.created;) {
    absl::StatusOr<EtcdRange> now = etcd_.Range(key, false);
    if (!now.ok()) return unreachable(now.status());
    const EtcdKv* held = now->kvs.empty() ? nullptr : &now->kvs[0];
    if (held != nullptr) {
      absl::StatusOr<BindingRecord> existing = Parse(*held);
      if (existing.ok() && !existing->retired) {
        out.existing = std::move(existing->entry);
        return out;
      }
      if (existing.status().code() == absl::StatusCode::kNotFound) {
        // Another host's claim: sealed within a round trip unless its
        // writer died. Taking it over now would make the two claimers
        // take it from each other (every host of a job registers the same
        // targets at once): wait for the seal, and take over only a claim
        // left unsealed for kClaimGraceMs (docs/design.md §10).
        if (held->mod_revision != unsealed) {
          unsealed = held->mod_revision;
          unsealed_since = absl::Now();
        }
        if (absl::Now() - unsealed_since < absl::Milliseconds(kClaimGraceMs)) {
          if (!Sleep(20))
            return unreachable(absl::UnavailableError("kregd is stopping"));
          continue;
        }
        spdlog::warn(
            "cluster: taking over the claim of {} in etcd (revision {}): "
            "another host claimed the name but did not seal its claim "
            "within {} ms (it died or lost etcd between claim and seal), so "
            "that claim counts for nothing",
            Named(proposed.key), held->mod_revision, kClaimGraceMs);
      }
      // A retirement, a claim left unsealed, or a record no kregd of this
      // cluster wrote at that place (a forgery, a replay): the name is
      // free.
      if (!existing.ok()) Ignored(existing.status());
    }
    // First registration wins: a create-if-absent, or a write guarded by
    // the record read.
    absl::StatusOr<bool> written = WriteAfter(key, kBindRecord, body, held, 0);
    if (!written.ok()) return unreachable(written.status());
    out.created = *written;
    ++attempt;
  }
  if (!out.created) {
    return absl::AbortedError(
        absl::StrCat("cannot register ", Named(proposed.key),
                     ": its record in etcd kept changing; retry"));
  }
  // The host record is republished once the binding is committed here
  // (Committed): listing the module before this host holds it would send
  // peers to fetch what it cannot serve yet.
  spdlog::info("cluster: claimed {} in etcd", Named(proposed.key));
  return out;
}

absl::Status ClusterRegistry::Replace(const TargetEntry& current,
                                      const TargetEntry& next) {
  const std::string key = BindingKey(prefix_, next.key);
  const std::string body = RecordJson(ToProto(next));
  auto unreachable = [&](const absl::Status& st) {
    return absl::UnavailableError(absl::StrCat(
        "cannot replace ", Named(next.key),
        ": the cluster registry of cluster \"", options_.cluster,
        "\" is unreachable (", st.message(),
        "). A generation is made in etcd for every host or not at all; "
        "generation ",
        current.generation,
        " stays. Retry once etcd is back; should etcd have applied this "
        "replacement before its answer was lost, the retry completes it"));
  };
  for (int attempt = 0; attempt < 3; ++attempt) {
    absl::StatusOr<EtcdRange> now = etcd_.Range(key, false);
    if (!now.ok()) return unreachable(now.status());
    absl::StatusOr<BindingRecord> held =
        now->kvs.empty() ? absl::NotFoundError("") : Parse(now->kvs[0]);
    if (!held.ok() || held->retired) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot replace ", Named(next.key),
          ": the cluster registry of cluster \"", options_.cluster, "\" ",
          held.ok() ? "holds its retirement"
          : now->kvs.empty()
              ? "holds no binding of it"
              : absl::StrCat("holds no binding of it that this cluster "
                             "signed (",
                             held.status().message(), ")"),
          ", so generation ", current.generation,
          " is not the cluster's to replace. Retire it on this host "
          "(kregctl retire ",
          next.key.name,
          "), then register the new build without replace=True"));
    }
    const TargetEntry& won = held->entry;
    if (SameBinding(won, next) && won.generation == next.generation) {
      return absl::OkStatus();  // a retry whose first answer was lost
    }
    if (!SameBinding(won, current) || won.generation != current.generation) {
      const uid_t by = won.generations.empty() ? won.registered_by.uid
                                               : won.generations.back().by.uid;
      return absl::AbortedError(absl::StrCat(
          "cannot replace ", Named(next.key), ": generation ",
          current.generation, " (content ", current.content_id,
          "), which this host holds, is no longer its cluster binding: "
          "generation ",
          won.generation, " (content ", won.content_id, ", module ",
          won.module_digest, ") was made on host ", won.host, " by uid ", by,
          ". This host catches up shortly; check with kregctl show, then "
          "retry the replacement if your build should still replace that "
          "generation"));
    }
    absl::StatusOr<bool> swapped =
        WriteAfter(key, kBindRecord, body, &now->kvs[0], 0);
    if (!swapped.ok()) return unreachable(swapped.status());
    if (*swapped) {
      spdlog::info("cluster: replaced {} in etcd: generation {} -> {}",
                   Named(next.key), current.generation, next.generation);
      return absl::OkStatus();  // republished once committed (Committed)
    }
  }
  return absl::AbortedError(
      absl::StrCat("cannot replace ", Named(next.key),
                   ": its record in etcd kept changing; retry"));
}

void ClusterRegistry::Unclaim(const TargetEntry& claimed) {
  const std::string key = BindingKey(prefix_, claimed.key);
  absl::StatusOr<EtcdRange> now = etcd_.Range(key, false);
  absl::Status st = now.status();
  if (st.ok() && now->kvs.size() == 1) {
    absl::StatusOr<BindingRecord> e = Parse(now->kvs[0]);
    if (e.ok() && !e->retired && SameBinding(e->entry, claimed) &&
        e->entry.host == host_id_) {
      st = WriteAfter(key, kRetireRecord, RecordJson(ToProto(claimed)),
                      &now->kvs[0], 0)
               .status();
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
  const std::string key = BindingKey(prefix_, entry.key);
  absl::StatusOr<EtcdRange> now = etcd_.Range(key, false);
  if (!now.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "cannot retire ", Named(entry.key),
        ": the cluster registry is unreachable (", now.status().message(),
        "); a retirement is made in etcd for every host or not at all. Retry "
        "once etcd is back."));
  }
  if (now->kvs.empty()) return absl::OkStatus();  // not bound in etcd
  absl::StatusOr<BindingRecord> e = Parse(now->kvs[0]);
  if (e.ok() && e->retired) return absl::OkStatus();  // retired already
  if (e.ok() && !SameBinding(e->entry, entry)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot retire ", Named(entry.key),
        ": the cluster binding is now "
        "content ",
        e->entry.content_id, " (host ", e->entry.host, "), not this host's ",
        entry.content_id, "; this host catches up shortly, then retry"));
  }
  // Never a bare delete: other hosts retire only on a signed retirement.
  KREG_ASSIGN_OR_RETURN(
      bool retired, WriteAfter(key, kRetireRecord, RecordJson(ToProto(entry)),
                               &now->kvs[0], 0));
  if (!retired) {
    return absl::AbortedError(absl::StrCat(
        "cannot retire ", Named(entry.key),
        ": its cluster binding changed during the retirement; retry"));
  }
  absl::MutexLock lock(&mu_);
  republish_ = true;
  return absl::OkStatus();
}

void ClusterRegistry::Committed(const TargetEntry& entry) {
  (void)entry;
  absl::MutexLock lock(&mu_);
  republish_ = true;
}

std::set<std::string> ClusterRegistry::Held() const {
  std::set<std::string> held;
  if (ClusterMirror* r = registry_.load()) {
    for (const EntryPtr& e : r->registry().List()) {
      if (!e->module_digest.empty() && e->unavailable.empty()) {
        held.insert(e->module_digest);
      }
      // Earlier generations' modules stored here (for other hosts' pins).
      for (const Generation& g : e->generations) {
        if (::access(store_->PathOf(g.module_digest).c_str(), R_OK) == 0) {
          held.insert(g.module_digest);
        }
      }
    }
  }
  return held;
}

std::shared_ptr<const std::string> ClusterRegistry::Relayed(
    const std::string& digest) const {
  absl::MutexLock lock(&relay_mu_);
  auto it = relayed_.find(digest);
  return it == relayed_.end() ? nullptr : it->second;
}

std::string ClusterRegistry::HostRecord() const {
  v1::ClusterHost h;
  h.set_address(options_.advertise);
  h.set_host_name(options_.host_name);
  h.set_version(kKregVersion);
  h.set_pid(::getpid());
  h.set_started_at_us(started_at_us_);
  for (const std::string& d : Held()) h.add_modules(d);
  return RecordJson(h);
}

absl::StatusOr<std::string> ClusterRegistry::FetchModule(
    const std::string& digest, uint64_t size) {
  return FetchFrom(digest, size, "");
}

absl::Status ClusterRegistry::Peers(const std::string& digest,
                                    std::vector<std::string>* holders,
                                    std::vector<std::string>* others) {
  KREG_ASSIGN_OR_RETURN(EtcdRange peers, etcd_.Range(prefix_ + "peers/", true));
  for (const EtcdKv& kv : peers.kvs) {
    absl::StatusOr<v1::ClusterHost> h =
        ParseSignedHostRecord(signer_, prefix_, kv.key, kv.value, PlaceOf(kv));
    if (!h.ok()) {
      Ignored(h.status());
      continue;
    }
    if (h->address() == options_.advertise) continue;
    bool has = false;
    for (const std::string& d : h->modules()) has = has || d == digest;
    (has ? holders : others)->push_back(h->address());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ClusterRegistry::FetchFrom(
    const std::string& digest, uint64_t size, const std::string& holder,
    const std::string& last) {
  if (size > options_.max_module_bytes) return TooLarge(digest, size);
  std::vector<std::string> first, then;
  KREG_RETURN_IF_ERROR(Peers(digest, &first, &then));
  // A host's record may not list what it got in the last seconds (its
  // rewrites are spaced out): `holder` has it all the same.
  if (auto it = std::find(then.begin(), then.end(), holder); it != then.end()) {
    then.erase(it);
    first.push_back(holder);
  }
  // Every host that lacks a module asks at once (a job start, a new
  // binding): each asks the holders in its own random order, so no one
  // peer serves them all.
  {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    std::shuffle(first.begin(), first.end(), rng);
    std::shuffle(then.begin(), then.end(), rng);
  }
  first.insert(first.end(), then.begin(), then.end());
  if (auto it = std::find(first.begin(), first.end(), last);
      !last.empty() && it != first.end()) {
    first.erase(it);
    first.push_back(last);
  }
  return Ask(digest, size, first);
}

absl::StatusOr<std::string> ClusterRegistry::FetchNew(
    const TargetEntry& binding, absl::Duration waited, absl::Duration* again) {
  const std::string& digest = binding.module_digest;
  const uint64_t size = binding.module_size;
  const std::string origin = AddressOf(binding.host);
  if (size > options_.max_module_bytes) return TooLarge(digest, size);
  if (origin.empty()) return FetchFrom(digest, size, origin);
  if (waited >= kFetchTreeGrace) {
    // Past the tree's time (a host of it down or slow): whoever has it by
    // now, the binding's host last (every host that lacks the module may
    // be here at once).
    return FetchFrom(digest, size, "", origin);
  }
  std::vector<std::string> hosts, others;
  KREG_RETURN_IF_ERROR(Peers(digest, &hosts, &others));
  hosts.insert(hosts.end(), others.begin(), others.end());
  std::vector<std::string> chain =
      FetchChain(digest, origin, options_.advertise, hosts);
  if (chain.empty()) return FetchFrom(digest, size, origin);
  // Every host saw the binding at about the same moment: a host d levels
  // below the origin first asks (d - 1) steps later, when its parent has
  // had the time to get the module.
  const absl::Duration due =
      kFetchTreeStep * static_cast<int64_t>(chain.size() - 1);
  if (waited < due) {
    *again = due - waited;
    return absl::UnavailableError(
        absl::StrCat("waiting for peer ", chain[0],
                     " (above this host in the module's "
                     "fetch tree) to get it"));
  }
  // Its ancestors, nearest first; the origin only when it is the parent
  // (it serves its own children only, while the tree fills).
  if (chain.size() > 1) chain.pop_back();
  absl::StatusOr<std::string> got = Ask(digest, size, chain);
  // Other bytes than the binding's are no race: RetryLoop's backoff.
  if (!got.ok() && got.status().code() != absl::StatusCode::kDataLoss) {
    *again = kFetchTreeStep;
  }
  return got;
}

absl::Status ClusterRegistry::TooLarge(const std::string& digest,
                                       uint64_t size) const {
  return absl::ResourceExhaustedError(absl::StrCat(
      "module ", digest, " is bound in etcd with a size of ", size,
      " bytes, more than this kregd's max_module_bytes (",
      options_.max_module_bytes,
      "); not fetched. Raise max_module_bytes on this host if the module "
      "is legitimate"));
}

absl::StatusOr<std::string> ClusterRegistry::Ask(
    const std::string& digest, uint64_t size,
    const std::vector<std::string>& peers) {
  if (peers.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "no other kregd of cluster \"", options_.cluster,
        "\" is advertised in etcd to fetch module ", digest, " from"));
  }
  std::vector<std::string> errors;
  bool data_loss = false, all_not_found = true;
  for (const std::string& address : peers) {
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
    // A peer without the module or busy is routine (the next is asked; a
    // fetch that fails in the end is logged by its caller); other bytes
    // are not.
    if (bytes.status().code() == absl::StatusCode::kDataLoss) {
      spdlog::warn("cluster: fetching module {}: {}", digest,
                   std::string(bytes.status().message()));
    }
    errors.push_back(std::string(bytes.status().message()));
  }
  std::string msg = absl::StrCat("no peer served module ", digest, " (",
                                 absl::StrJoin(errors, "; "), ")");
  if (data_loss) return absl::DataLossError(msg);
  if (all_not_found) return absl::NotFoundError(msg);
  return absl::UnavailableError(msg);
}

void ClusterRegistry::Apply(const TargetEntry& binding, bool may_fetch,
                            bool retry) {
  ClusterMirror* r = registry_.load();
  std::shared_ptr<const std::string> relay;
  if (binding.kind == TargetKind::kModule &&
      !store_->Verify(binding.module_digest).ok()) {
    if (!may_fetch) return;
    if (r->Registering(binding.key, binding.module_digest)) {
      // This host is registering the same module under the name right now
      // (a job start: every host registers the same targets at once): its
      // own copy is committed shortly, and Mirror waits for that. No fetch.
    } else {
      // One try: the watch thread never waits here (the events behind
      // this one would wait too). The registering host may not have
      // committed its copy yet, or this host's parent in the module's
      // fetch tree not got it yet: RetryLoop tries again shortly.
      absl::Duration waited = absl::ZeroDuration();
      if (retry) {
        absl::MutexLock lock(&mu_);
        auto it = unmirrored_.find(binding.key);
        if (it != unmirrored_.end()) waited = absl::Now() - it->second.since;
      }
      absl::Duration again = absl::ZeroDuration();
      absl::StatusOr<std::string> got = FetchNew(binding, waited, &again);
      if (!got.ok()) {
        const absl::StatusCode code = got.status().code();
        const std::string why = absl::StrCat(
            "its module could not be fetched: ", got.status().message());
        if (code == absl::StatusCode::kDataLoss ||
            code == absl::StatusCode::kResourceExhausted) {
          // Not a race: say so now.
          if (!retry) CannotTake(binding, why);
        }
        // Larger than max_module_bytes: not fetched, however often asked.
        if (code != absl::StatusCode::kResourceExhausted) {
          Unmirrored(binding, why, again);
        }
        return;
      }
      relay = std::make_shared<const std::string>(*std::move(got));
      absl::MutexLock lock(&relay_mu_);
      relayed_[binding.module_digest] = relay;
    }
  }
  absl::Status st = r->Mirror(binding, relay ? *relay : std::string());
  if (relay != nullptr) {
    // Served from the store from here on (Held), or not at all.
    absl::MutexLock lock(&relay_mu_);
    auto it = relayed_.find(binding.module_digest);
    if (it != relayed_.end() && it->second == relay) relayed_.erase(it);
  }
  if (!st.ok()) {
    if (!retry) {
      spdlog::error("cluster: cannot bind {} as on host {}: {}",
                    Named(binding.key), binding.host,
                    std::string(st.message()));
      if (may_fetch) r->MirrorFailed(binding, std::string(st.message()));
    }
    if (may_fetch) Unmirrored(binding, std::string(st.message()));
  } else {
    bool warned = false;
    {
      absl::MutexLock lock(&mu_);
      auto it = unmirrored_.find(binding.key);
      if (it != unmirrored_.end()) {
        warned = it->second.warned;
        unmirrored_.erase(it);
      }
    }
    if (warned) {
      spdlog::info("cluster: {} is bound here now, as on host {}",
                   Named(binding.key), binding.host);
    }
    if (may_fetch) FetchGenerations(binding);
  }
  absl::MutexLock lock(&mu_);
  republish_ = true;
}

void ClusterRegistry::CannotTake(const TargetEntry& binding,
                                 const std::string& why) {
  constexpr absl::string_view kFetch = "its module could not be fetched: ";
  spdlog::warn(
      "cluster: {} is bound cluster-wide (host {}, module {}) but this host "
      "{}; it is not runnable here until it can (retried in the background; "
      "check that the peers are up and reachable: kregctl hosts)",
      Named(binding.key), binding.host, binding.module_digest,
      absl::StartsWith(why, kFetch)
          ? absl::StrCat("could not fetch its module: ",
                         why.substr(kFetch.size()))
          : absl::StrCat("could not bind it: ", why));
  registry_.load()->MirrorFailed(binding, why);
}

void ClusterRegistry::Unmirrored(const TargetEntry& binding,
                                 const std::string& why, absl::Duration again) {
  absl::MutexLock lock(&mu_);
  auto [it, added] = unmirrored_.try_emplace(binding.key);
  Unmirror& u = it->second;
  if (added || !SameBinding(u.binding, binding) ||
      u.binding.generation != binding.generation) {
    u = Unmirror{binding, absl::Now(), absl::Now(), 0, false, why};
  }
  u.why = why;
  if (again > absl::ZeroDuration()) {
    u.next = absl::Now() + again;  // the fetch tree's pace
    return;
  }
  u.next = absl::Now() + absl::Milliseconds(50LL << std::min(u.tries, 9));
  ++u.tries;
}

void ClusterRegistry::RetryLoop() {
  // A binding this host could not take (no peer served its module yet:
  // the registering host commits its copy just after the seal; etcd went
  // away during the fetch) is tried again while etcd still binds it: after
  // 50 ms, doubling to 25.6 s; after 5 s of failures the log and the
  // replacing host (an acknowledgement with the error) are told.
  while (true) {
    std::vector<Unmirror> due;
    {
      absl::MutexLock lock(&mu_);
      if (unmirrored_.empty()) {
        mu_.Await(absl::Condition(this, &ClusterRegistry::RetryWoken));
      } else {
        mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                             absl::Milliseconds(50));
      }
      if (stopping_) return;
      const absl::Time now = absl::Now();
      for (const auto& [key, u] : unmirrored_) {
        if (u.next <= now) due.push_back(u);
      }
    }
    for (const Unmirror& u : due) {
      absl::StatusOr<EtcdRange> now =
          etcd_.Range(BindingKey(prefix_, u.binding.key), false);
      if (!now.ok()) break;  // etcd away: next round
      absl::StatusOr<BindingRecord> b =
          now->kvs.empty() ? absl::NotFoundError("") : Parse(now->kvs[0]);
      if (!b.ok() || b->retired) {
        absl::MutexLock lock(&mu_);
        unmirrored_.erase(u.binding.key);  // the watch says what is now
        continue;
      }
      Apply(b->entry, /*may_fetch=*/true, /*retry=*/true);
      std::optional<Unmirror> left;
      {
        absl::MutexLock lock(&mu_);
        auto it = unmirrored_.find(u.binding.key);
        if (it != unmirrored_.end() && !it->second.warned &&
            absl::Now() - it->second.since >= absl::Seconds(5)) {
          it->second.warned = true;
          left = it->second;
        }
      }
      if (left.has_value()) CannotTake(left->binding, left->why);
    }
  }
}

void ClusterRegistry::FetchGenerations(const TargetEntry& binding) {
  for (const Generation& g : binding.generations) {
    if (g.module_digest == binding.module_digest ||
        ::access(store_->PathOf(g.module_digest).c_str(), F_OK) == 0) {
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      if (!tried_.insert(g.module_digest).second) continue;  // once
    }
    absl::StatusOr<std::string> got =
        FetchModule(g.module_digest, g.module_size);
    absl::Status st = got.status();
    if (got.ok()) st = registry_.load()->StoreModule(g.module_digest, *got);
    if (!st.ok()) {
      spdlog::warn(
          "cluster: generation {} of {} (module {}) is not stored here and "
          "could not be fetched: {}; a process pinning that generation on "
          "this host is refused",
          g.generation, Named(binding.key), g.module_digest,
          std::string(st.message()));
    }
  }
}

absl::Status ClusterRegistry::Reconcile(int64_t* revision) {
  ClusterMirror* r = registry_.load();
  std::vector<EntryPtr> before = r->registry().List();
  KREG_ASSIGN_OR_RETURN(EtcdRange all, etcd_.Range(prefix_ + "targets/", true));
  std::map<TargetKey, BindingRecord> records;
  for (const EtcdKv& kv : all.kvs) {
    absl::StatusOr<BindingRecord> b = Parse(kv);
    if (!b.ok()) {
      Ignored(b.status());
      continue;
    }
    if (!b->retired) Apply(b->entry, /*may_fetch=*/true);
    records[b->entry.key] = *std::move(b);
  }
  for (const EntryPtr& e : before) {
    auto rec = records.find(e->key);
    if (rec == records.end()) {
      // Absent or unsigned in etcd: only a signed retirement retires.
      spdlog::warn(
          "cluster: {} (content {}) is bound here but etcd holds no signed "
          "binding or retirement of it (deleted from etcd by other than "
          "kregd, or registered while this kregd was not in the cluster); "
          "kept here. Retire it with kregctl retire if it should go",
          Named(e->key), e->content_id);
    } else if (rec->second.retired) {
      absl::Status st = r->Unmirror(
          rec->second.entry,
          "retired cluster-wide (on another host while this kregd was away)");
      if (!st.ok()) spdlog::error("cluster: {}", std::string(st.message()));
    }
  }
  // Reservations made or lifted while this kregd was away (the watch
  // starts after the bindings' revision: later changes come again).
  KREG_ASSIGN_OR_RETURN(EtcdRange reserved,
                        etcd_.Range(prefix_ + "reservations/", true));
  for (const EtcdKv& kv : reserved.kvs) ApplyReservation(kv);
  *revision = all.revision;
  spdlog::info("cluster: in sync with etcd at revision {} ({} records)",
               all.revision, all.kvs.size() + reserved.kvs.size());
  return absl::OkStatus();
}

absl::Status ClusterRegistry::PublishReservation(const NameReservation& r,
                                                 bool lifted) {
  const std::string key = ReservationKey(prefix_, r.pattern);
  // A lifting is a signed record too: other hosts lift only on one.
  return WriteSigned(key, kReserveRecord, ReservationJson(r, lifted), 0);
}

void ClusterRegistry::PublishAck(
    const TargetEntry& entry, const std::vector<Repointer::Laggard>& laggards,
    const std::string& error) {
  // Under this host's lease: gone with the host. One key per (target,
  // host): the next generation's acknowledgement overwrites it.
  const std::string key = AckKey(prefix_, entry.key, options_.advertise);
  const int64_t lease = lease_.load();
  // Without a lease this host is not among the peers/ anyone waits for.
  if (lease == 0) return;
  absl::Status st = WriteSigned(
      key, kAckRecord,
      AckJson(entry.generation, MadeAt(entry), laggards, error), lease);
  if (!st.ok()) {
    spdlog::warn(
        "cluster: cannot acknowledge generation {} of {} in etcd ({}); the "
        "host that replaced it names this host as one that did not report",
        entry.generation, Named(entry.key), std::string(st.message()));
  }
}

PeerAcks ClusterRegistry::AwaitPeerAcks(const TargetEntry& entry,
                                        absl::Time deadline) {
  // The other live hosts when the wait starts (a host that joins later
  // reconciles to this generation: nothing of it to switch); one that
  // leaves meanwhile is no longer waited for.
  std::map<std::string, std::string> waiting;  // address -> "NAME (ADDRESS)"
  bool listed = false;
  absl::Status last;
  PeerAcks out;
  for (int64_t wait_ms = 20;; wait_ms = std::min<int64_t>(wait_ms * 2, 200)) {
    absl::StatusOr<EtcdRange> peers = etcd_.Range(prefix_ + "peers/", true);
    absl::StatusOr<EtcdRange> acks =
        peers.ok() ? etcd_.Range(AckKey(prefix_, entry.key, ""), true)
                   : peers.status();
    last = acks.status();
    if (acks.ok()) {
      std::set<std::string> live;
      for (const EtcdKv& kv : peers->kvs) {
        absl::StatusOr<v1::ClusterHost> h = ParseSignedHostRecord(
            signer_, prefix_, kv.key, kv.value, PlaceOf(kv));
        if (!h.ok()) Ignored(h.status());
        if (!h.ok() || h->address() == options_.advertise) continue;
        live.insert(h->address());
        if (!listed) waiting[h->address()] = PeerName(*h);
      }
      listed = true;
      for (auto it = waiting.begin(); it != waiting.end();) {
        it = live.count(it->first) ? std::next(it) : waiting.erase(it);
      }
      for (const EtcdKv& kv : acks->kvs) {
        absl::StatusOr<AckRecord> a = ParseSignedAck(
            signer_, prefix_, entry.key, kv.key, kv.value, PlaceOf(kv));
        if (!a.ok()) {
          Ignored(a.status());
          continue;
        }
        auto it = waiting.find(a->address);
        if (it == waiting.end() || a->generation != entry.generation ||
            a->made_at_us != MadeAt(entry)) {
          continue;  // not (yet) of this generation
        }
        for (Repointer::Laggard& l : a->laggards) {
          l.host = it->second;
          out.laggards.push_back(std::move(l));
        }
        if (!a->error.empty()) out.hosts.push_back({it->second, a->error});
        waiting.erase(it);
      }
    }
    if ((listed && waiting.empty()) || absl::Now() >= deadline ||
        !Sleep(std::min<int64_t>(
            wait_ms, absl::ToInt64Milliseconds(deadline - absl::Now()) + 1))) {
      break;
    }
  }
  if (!listed) {
    out.hosts.push_back(
        {"", absl::StrCat("the cluster registry (etcd) could not be read (",
                          last.message(), ")")});
  }
  for (const auto& [address, name] : waiting) out.hosts.push_back({name, ""});
  return out;
}

bool ClusterRegistry::ApplyReservation(const EtcdKv& kv) {
  absl::StatusOr<ReservationEvent> r =
      ParseSignedReservation(signer_, prefix_, kv.key, kv.value, PlaceOf(kv));
  if (!r.ok()) {
    Ignored(r.status());
    return r.status().code() == absl::StatusCode::kNotFound;
  }
  absl::Status st =
      registry_.load()->MirrorReservation(r->reservation, r->lifted);
  if (!st.ok()) spdlog::error("cluster: {}", std::string(st.message()));
  return true;
}

void ClusterRegistry::OnEvent(const EtcdEvent& ev) {
  if (absl::StartsWith(ev.kv.key, prefix_ + "targets/")) {
    OnBindingEvent(ev);
  } else if (absl::StartsWith(ev.kv.key, prefix_ + "reservations/")) {
    const bool was_valid =
        ev.prev.create_revision != 0 &&
        ParseSignedReservation(signer_, prefix_, ev.prev.key, ev.prev.value,
                               PlaceOf(ev.prev))
            .ok();
    if (!ev.deleted) {
      // A record that is not valid at its place (a replayed lifting, a
      // forgery) changes nothing; the one it overwrote is put back, for
      // the hosts that start later.
      if (!ApplyReservation(ev.kv) && was_valid) PutBack(ev.prev);
    } else if (was_valid) {
      // A delete lifts nothing, only a signed lifting does: the record it
      // removed is put back, for the hosts that start later.
      Ignored(absl::PermissionDeniedError(absl::StrCat(
          "etcd key \"", ev.kv.key.substr(0, 200),
          "\" was deleted, but a reservation is lifted only by a signed "
          "lifting (kregctl reserve PATTERN --lift); its record is put back")));
      PutBack(ev.prev);
    }
  }
}

void ClusterRegistry::OnBindingEvent(const EtcdEvent& ev) {
  if (ev.deleted) {
    // Kregd never deletes a binding: a delete is someone else's. Nothing
    // is retired for it; the signed record it removed is put back.
    absl::StatusOr<BindingRecord> gone = Parse(ev.prev);
    if (!gone.ok() || gone->retired) return;
    Ignored(absl::PermissionDeniedError(absl::StrCat(
        "etcd key \"", ev.kv.key.substr(0, 200),
        "\" was deleted, but a binding is retired only by a signed "
        "retirement (kregctl retire); ",
        Named(gone->entry.key), " stays bound and its record is put back")));
    PutBack(ev.prev);
    return;
  }
  absl::StatusOr<BindingRecord> b = Parse(ev.kv);
  if (!b.ok()) {
    Ignored(b.status());
    // Not a claim being sealed but a record no kregd wrote at this place
    // (a replay, a forgery): the one it overwrote, if the cluster's, is
    // put back for the hosts that start later.
    if (b.status().code() != absl::StatusCode::kNotFound &&
        ev.prev.create_revision != 0) {
      PutBack(ev.prev);
    }
    return;
  }
  if (b->retired) {
    absl::Status st = registry_.load()->Unmirror(
        b->entry, "retired cluster-wide (kregctl retire on some host)");
    if (!st.ok()) spdlog::error("cluster: {}", std::string(st.message()));
    absl::MutexLock lock(&mu_);
    unmirrored_.erase(b->entry.key);
    republish_ = true;
    return;
  }
  // Made here: committed by the registration itself, unless etcd applied
  // a claim whose answer was lost (then bind it if the module is here).
  Apply(b->entry, /*may_fetch=*/b->entry.host != host_id_);
}

void ClusterRegistry::WatchLoop() {
  int64_t revision = 0;
  bool synced = false;
  // failing: etcd did not answer (logged once, until it answers again);
  // moved: the watch's member failed and the next one is being asked
  // (one member lost is no outage: the others answer).
  bool failing = false, moved = false;
  int64_t backoff_ms = 200;
  auto on_event = [this](const EtcdEvent& ev) { OnEvent(ev); };
  auto answers = [&](const std::string& member) {
    if (failing) {
      spdlog::info(
          "cluster: etcd answers again (watching from revision {} on {})",
          revision + 1, member);
    }
    failing = moved = false;
    backoff_ms = 200;
  };
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    absl::Status st;
    if (!synced) {
      st = Reconcile(&revision);
      synced = st.ok();  // answers() once the watch is on
    } else {
      int64_t last = revision;
      // Bindings and reservations only (reservations/ .. targets/): the
      // peers/, acks/ and compile keys change with every host's state and
      // are read when needed; watched, every host would receive every
      // other host's record rewrites (N x N events).
      st = etcd_.Watch(prefix_ + "reservations/",
                       PrefixEnd(prefix_ + "targets/"), revision + 1, on_event,
                       answers, &last);
      revision = last;
      if (st.code() == absl::StatusCode::kCancelled) return;
      if (st.code() == absl::StatusCode::kOutOfRange) synced = false;
    }
    if (st.ok()) continue;
    if (!failing && !moved && synced &&
        st.code() == absl::StatusCode::kUnavailable) {
      // The watch's member went away: the next member resumes it at once.
      spdlog::warn(
          "cluster: {}; asking the next member (the watch resumes at "
          "revision {}, nothing is missed)",
          std::string(st.message()), revision + 1);
      moved = true;
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
  const std::string key = HostKey(prefix_, options_.advertise);
  const absl::Duration keepalive_every =
      absl::Milliseconds(options_.lease_ttl_s * 1000 / 3);
  int64_t lease = 0;
  std::string published;
  bool warned = false;
  // What this host holds changed since the record was written. At a job
  // start it changes with every target: each host rewrites its record at
  // most once per hosts x 200 ms (1 s to 15 s), so the cluster's hosts
  // together write at most ~5 records a second, however many there are
  // (docs/operator-guide.md, "Sizing"); a fetcher asks the binding's host
  // even before its record lists the module. The keep-alives never wait
  // for that.
  bool dirty = true;
  int64_t hosts = 1;  // advertised, counted at each keep-alive
  absl::Time written = absl::InfinitePast();
  absl::Time keepalive_at = absl::Now();
  while (true) {
    absl::Status st;
    const absl::Time now = absl::Now();
    const absl::Duration gap =
        absl::Milliseconds(std::clamp<int64_t>(hosts * 200, 1000, 15000));
    if (lease == 0) {
      absl::StatusOr<int64_t> granted = etcd_.GrantLease(options_.lease_ttl_s);
      st = granted.status();
      if (granted.ok()) {
        lease = *granted;
        lease_.store(lease);
        published.clear();
        dirty = true;
        written = absl::InfinitePast();
      }
    }
    if (lease != 0 && dirty && now >= written + gap) {
      std::string record = HostRecord();
      if (record != published) {
        st = WriteSigned(key, kHostRecord, record, lease);
        if (st.ok()) {
          published = record;
          written = now;
        }
      }
      if (st.ok()) dirty = false;
    }
    if (lease != 0 && st.ok() && now >= keepalive_at) {
      absl::StatusOr<int64_t> ttl = etcd_.KeepAlive(lease);
      st = ttl.status();
      if (st.code() == absl::StatusCode::kNotFound) lease_.store(lease = 0);
      if (st.ok()) {
        absl::StatusOr<int64_t> n = etcd_.Count(prefix_ + "peers/");
        if (n.ok()) hosts = std::max<int64_t>(1, *n);
      }
      keepalive_at = now + keepalive_every;
    }
    if (!st.ok() && !warned) {
      spdlog::warn("cluster: cannot advertise this host in etcd: {}",
                   std::string(st.message()));
    }
    if (st.ok() && warned) {
      spdlog::info("cluster: advertised as {} (lease {:x})", key, lease);
    }
    warned = !st.ok();
    absl::Time until = st.ok() ? keepalive_at : now + absl::Seconds(1);
    if (st.ok() && dirty) until = std::min(until, written + gap);
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(this, &ClusterRegistry::Woken),
                         std::max(until - absl::Now(), absl::ZeroDuration()));
    if (republish_) dirty = true;
    republish_ = false;
    if (stopping_) break;
    if (!st.ok()) keepalive_at = absl::Now();  // retry it all now
  }
  lease_.store(0);
  if (lease != 0) (void)etcd_.Revoke(lease);  // peers stop asking at once
}

absl::StatusOr<v1::ListClusterTargetsResponse> ClusterRegistry::ListTargets() {
  absl::StatusOr<EtcdRange> all = etcd_.Range(prefix_ + "targets/", true);
  if (!all.ok()) return Unreachable(all.status());
  v1::ListClusterTargetsResponse out;
  out.set_cluster(options_.cluster);
  out.set_revision(all->revision);
  for (const EtcdKv& kv : all->kvs) {
    absl::StatusOr<BindingRecord> b = Parse(kv);
    if (b.ok() && !b->retired) *out.add_targets() = ToProto(b->entry);
  }
  return out;
}

absl::StatusOr<v1::ListHostsResponse> ClusterRegistry::ListHosts() {
  absl::StatusOr<EtcdRange> all = etcd_.Range(prefix_ + "peers/", true);
  if (!all.ok()) return Unreachable(all.status());
  v1::ListHostsResponse out;
  out.set_cluster(options_.cluster);
  for (const EtcdKv& kv : all->kvs) {
    // Only hosts of this cluster, as they advertised themselves last.
    absl::StatusOr<v1::ClusterHost> signed_host =
        ParseSignedHostRecord(signer_, prefix_, kv.key, kv.value, PlaceOf(kv));
    if (!signed_host.ok()) {
      Ignored(signed_host.status());
      continue;
    }
    v1::ClusterHost* h = out.add_hosts();
    *h = *std::move(signed_host);
    h->set_lease_id(kv.lease);
    absl::StatusOr<int64_t> ttl = etcd_.TimeToLive(kv.lease);
    h->set_lease_ttl_s(ttl.ok() ? *ttl : -1);
    h->set_self(h->address() == options_.advertise);
  }
  return out;
}

}  // namespace kreg
