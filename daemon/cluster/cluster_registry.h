// Cluster mode (DESIGN §10): the (cluster, name, platform) -> identity
// bindings live in etcd; this kregd claims its registrations there, mirrors
// the others' into its registry (watch), advertises itself under a leased
// key and fetches missing modules from peers.
#ifndef KREGD_DAEMON_CLUSTER_CLUSTER_REGISTRY_H_
#define KREGD_DAEMON_CLUSTER_CLUSTER_REGISTRY_H_

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/cluster/cluster_mirror.h"
#include "daemon/cluster/cluster_records.h"
#include "daemon/cluster/etcd_client.h"
#include "daemon/cluster/peer_tls.h"
#include "daemon/cluster/record_signer.h"
#include "daemon/registry/binding_authority.h"
#include "daemon/store/module_store.h"
#include "kreg/v1/cluster.pb.h"

namespace kreg {

// How long another host's claim may stay unsealed before a registration
// takes the name over (its writer died between claim and seal).
inline constexpr int64_t kClaimGraceMs = 3000;

// A host that lacks the module of a binding it just saw fetches it from its
// parent in the module's fetch tree (fetch_tree.h), not before its level's
// turn (a step per level below the root's children), trying its ancestors
// again each step; after the grace, from any peer that has it (the
// binding's host last).
inline constexpr absl::Duration kFetchTreeStep = absl::Milliseconds(100);
inline constexpr absl::Duration kFetchTreeGrace = absl::Seconds(3);

struct ClusterOptions {
  std::string cluster = "default";
  std::string host_name;  // this host, in messages and `kregctl hosts`
  std::string advertise;  // HOST:PORT peers fetch modules from
  EtcdOptions etcd;
  // The cluster key (cluster_key_file): every record this kregd writes to
  // etcd is signed with it, and one that is not is never acted on.
  std::string key;
  PeerTls tls;
  int64_t lease_ttl_s = 10;
  int64_t fetch_timeout_ms = 60000;
  // A binding whose module is larger is not fetched from peers (kregd's
  // max_module_bytes: etcd's module_size is a claim of another host).
  uint64_t max_module_bytes = 512ull << 20;
};

// Owns the etcd client and the watch and lease threads. Thread-safe. The
// registry and the store must outlive it; Stop before they go.
class ClusterRegistry : public BindingAuthority {
 public:
  ClusterRegistry(ClusterOptions options, const ModuleStore* store);
  ~ClusterRegistry() override;
  ClusterRegistry(const ClusterRegistry&) = delete;
  ClusterRegistry& operator=(const ClusterRegistry&) = delete;

  // Starts the threads for `mirror` (built on this authority): reconcile the
  // journaled entries with etcd (when etcd answers; retried until it does),
  // then watch; advertise this host under a leased key. Never fails for an
  // unreachable etcd: known targets keep working meanwhile.
  void Start(ClusterMirror* mirror);
  void Stop();

  // BindingAuthority.
  std::string HostName() const override { return host_id_; }
  absl::StatusOr<ClaimResult> Claim(const TargetEntry& proposed) override;
  absl::Status Replace(const TargetEntry& current,
                       const TargetEntry& next) override;
  void Committed(const TargetEntry& entry) override;
  void Unclaim(const TargetEntry& claimed) override;
  absl::Status Release(const TargetEntry& entry) override;
  absl::StatusOr<std::string> FetchModule(const std::string& digest,
                                          uint64_t size) override;
  absl::Status PublishReservation(const NameReservation& r,
                                  bool lifted) override;
  void PublishAck(const TargetEntry& entry,
                  const std::vector<Repointer::Laggard>& laggards,
                  const std::string& error) override;
  PeerAcks AwaitPeerAcks(const TargetEntry& entry,
                         absl::Time deadline) override;

  // What etcd holds (kregctl list --cluster, kregctl hosts). UNAVAILABLE
  // when it cannot be reached.
  absl::StatusOr<v1::ListClusterTargetsResponse> ListTargets();
  absl::StatusOr<v1::ListHostsResponse> ListHosts();

  // The modules this host serves (its registered targets', every stored
  // generation's).
  std::set<std::string> Held() const;
  // The verified bytes of `digest` while this host binds a module it just
  // fetched (null otherwise): its children in the module's fetch tree get
  // them before this host's own probe and commit end, so a level of the
  // tree costs a transfer, not a bind (docs/operator-guide.md "Sizing").
  std::shared_ptr<const std::string> Relayed(const std::string& digest) const;

  // The compile service across hosts (DESIGN §13; cluster_compile.cc):
  // etcd maps a compile cache key to the module a host built for it
  // (compiled/<key hex>: "<digest> <size>"), and one host at a time claims
  // a key it is compiling (compiling/<key hex>, under a lease).
  struct CompiledModule {
    std::string digest;
    uint64_t size = 0;
  };
  // The module recorded for `key_hex`, or nullopt. UNAVAILABLE without etcd.
  absl::StatusOr<std::optional<CompiledModule>> FindCompiled(
      const std::string& key_hex);
  // Records what this host built for `key_hex` (first record wins).
  absl::Status RecordCompiled(const std::string& key_hex,
                              const CompiledModule& module);
  // Claims `key_hex` for this host for `ttl_s` seconds: the lease id when
  // this host got it, 0 when another host holds it.
  absl::StatusOr<int64_t> ClaimCompile(const std::string& key_hex,
                                       int64_t ttl_s);
  // Ends a claim (its lease).
  void ReleaseCompile(int64_t lease);

  const std::string& cluster() const { return options_.cluster; }

 private:
  absl::StatusOr<BindingRecord> Parse(const EtcdKv& kv) const;
  // The other hosts advertised in etcd: those whose records list `digest`
  // into `holders`, the rest into `others`. etcd's errors.
  absl::Status Peers(const std::string& digest,
                     std::vector<std::string>* holders,
                     std::vector<std::string>* others);
  // FetchModule, asking `holder` (an address; empty: none) among the peers
  // whose records list the module, then the others (each list in a random
  // order), `last` (an address; empty: none) last.
  absl::StatusOr<std::string> FetchFrom(const std::string& digest,
                                        uint64_t size,
                                        const std::string& holder,
                                        const std::string& last = "");
  // The module of `binding`, which this host saw `waited` ago and lacks
  // (fetch_tree.h): while that is under kFetchTreeGrace, from its
  // ancestors in the module's fetch tree only, not before its place's
  // turn; then as FetchFrom, the binding's host last. When it failed for
  // now, `again` may say when to try next (zero: RetryLoop's backoff).
  absl::StatusOr<std::string> FetchNew(const TargetEntry& binding,
                                       absl::Duration waited,
                                       absl::Duration* again);
  // Asks `peers` in this order; the first that serves wins.
  absl::StatusOr<std::string> Ask(const std::string& digest, uint64_t size,
                                  const std::vector<std::string>& peers);
  absl::Status TooLarge(const std::string& digest, uint64_t size) const;
  // Logs (rate-limited) that a record of etcd was not acted on; nothing
  // for NOT_FOUND (a record not sealed yet is no news).
  static void Ignored(const absl::Status& why);
  // Writes `body` as a `kind` record under `key` at the place after `now`
  // (the key as read: guarded by its mod_revision), with `lease` unless 0;
  // `now` null or of an absent key: creates the key (a claim), then seals
  // it. True when written, false when the key changed meanwhile (nothing
  // of this write counts then). etcd's errors.
  absl::StatusOr<bool> WriteAfter(const std::string& key,
                                  const std::string& kind,
                                  const std::string& body, const EtcdKv* now,
                                  int64_t lease);
  // WriteAfter at whatever place the key is (the last writer wins);
  // ABORTED when the key kept changing.
  absl::Status WriteSigned(const std::string& key, const std::string& kind,
                           const std::string& body, int64_t lease);
  // Puts `prev`, a record of the cluster a write other than a kregd's
  // removed or replaced (a delete, a replay, a forgery), back at its key's
  // next place, unless the key holds a valid record again meanwhile.
  void PutBack(const EtcdKv& prev);
  // The watch saw `ev`, a put or a delete under the cluster's prefix.
  void OnEvent(const EtcdEvent& ev);
  void OnBindingEvent(const EtcdEvent& ev);
  // A reservation record (a put under reservations/) into the registry;
  // false when it is not a valid record at its place (logged).
  bool ApplyReservation(const EtcdKv& kv);
  // Bring a binding into the registry, fetching its module from a peer
  // when this host lacks it and `may_fetch` (one try; `retry`: RetryLoop's,
  // which logs only how it ends). A binding not taken is kept for
  // RetryLoop.
  void Apply(const TargetEntry& binding, bool may_fetch, bool retry = false);
  // Logs that `binding` is not runnable here and why, and tells a host
  // that waits for this one's acknowledgement.
  void CannotTake(const TargetEntry& binding, const std::string& why);
  // Keeps `binding` for RetryLoop: next tried after `again`, or after 50
  // ms doubling with each try when zero.
  void Unmirrored(const TargetEntry& binding, const std::string& why,
                  absl::Duration again = absl::ZeroDuration());
  void RetryLoop();
  // The modules of `binding`'s earlier generations this host lacks, from
  // peers (each digest tried once per run), for pins (docs/replace.md §9).
  void FetchGenerations(const TargetEntry& binding);
  absl::Status Reconcile(int64_t* revision);
  void WatchLoop();
  void LeaseLoop();
  // The host record with the modules held now.
  std::string HostRecord() const;
  // Waits up to `ms` or until Stop; false when stopping.
  bool Sleep(int64_t ms);
  bool Woken() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || republish_;
  }
  bool RetryWoken() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !unmirrored_.empty();
  }

  const ClusterOptions options_;
  const std::string prefix_;   // "/kregd/<cluster>/"
  const std::string host_id_;  // "<host name> (<advertise>)"
  const int64_t started_at_us_;
  const ModuleStore* const store_;
  const RecordSigner signer_;
  EtcdClient etcd_;
  std::shared_ptr<grpc::ChannelCredentials> peer_creds_;
  std::atomic<ClusterMirror*> registry_{nullptr};
  // The lease of this host's record (LeaseLoop), which its
  // acknowledgements share: 0 while it has none.
  std::atomic<int64_t> lease_{0};
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool republish_ ABSL_GUARDED_BY(mu_) = false;
  std::set<std::string> tried_ ABSL_GUARDED_BY(mu_);  // FetchGenerations
  // Bindings of etcd this host could not take yet (RetryLoop).
  struct Unmirror {
    TargetEntry binding;
    absl::Time since;  // first failure
    absl::Time next;   // next try
    int tries = 0;
    bool warned = false;  // CannotTake said so
    std::string why;
  };
  std::map<TargetKey, Unmirror> unmirrored_ ABSL_GUARDED_BY(mu_);
  // Relayed(): at most one module per thread that runs Apply (the watch
  // and RetryLoop), so at most 2 x max_module_bytes.
  mutable absl::Mutex relay_mu_;
  std::map<std::string, std::shared_ptr<const std::string>> relayed_
      ABSL_GUARDED_BY(relay_mu_);
  std::thread watch_thread_;
  std::thread lease_thread_;
  std::thread retry_thread_;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_CLUSTER_CLUSTER_REGISTRY_H_
