// The (target_name, platform) -> handler registry of kregd (DESIGN §2).
#ifndef KREGD_DAEMON_REGISTRY_REGISTRY_H_
#define KREGD_DAEMON_REGISTRY_REGISTRY_H_

#include <atomic>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/base/types.h"
#include "daemon/registry/binding_authority.h"
#include "daemon/registry/binding_oracle.h"
#include "daemon/registry/repointer.h"

namespace kreg {

// A validated registration request (see validate.h for the edge checks).
struct RegisterArgs {
  TargetKey key;
  std::string func_name;
  std::string content_id;  // empty: "sha256:<hex>" of module_bytes
  std::string module_bytes;
  std::string origin;  // "path:<p>" or "upload:<n> bytes"
  PeerCred peer;
  bool replace = false;
  // kInProcess: nothing is stored or loaded; content_id is the identity.
  TargetKind kind = TargetKind::kModule;
};

struct RegisterOutcome {
  bool created = false;  // false: identical registration existed (no-op)
  EntryPtr entry;
  // Inside the registry only: a replacement whose holders on this host
  // were re-pointed (`laggards`: those that did not switch), and the
  // deadline of that re-point (docs/replace.md §5, §9).
  bool replaced = false;
  std::vector<Repointer::Laggard> laggards;
  absl::Time deadline;
};

// Who holds a binding and since when, for refusals: "uid 1000 (alice)
// since 2025-01-02T03:04:05Z". The user name is left out when the uid has
// no passwd entry here (an NSS lookup: never under the registry's lock);
// the time when the entry has none.
std::string Holder(const TargetEntry& e);

// DEADLINE_EXCEEDED's text for a replacement of `entry` whose `laggards`
// did not switch within `timeout` (docs/replace.md section 5), and (cluster
// mode, §9) whose other `hosts` did not report or could not take it.
std::string LaggardsMessage(const TargetEntry& entry,
                            const std::vector<Repointer::Laggard>& laggards,
                            const std::vector<PeerAcks::Host>& hosts,
                            absl::Duration timeout);

// How much longer than replace_timeout a replacement in cluster mode waits
// for the other hosts' acknowledgements (docs/replace.md §9): they start
// their re-point when their watch sees the generation, a moment after
// this host's.
constexpr absl::Duration kPeerAckGrace = absl::Seconds(3);

// A module written for a pending registration. Nothing is in the store
// until the registration is accepted and the module committed.
struct StagedModule {
  std::string digest;  // "sha256:<hex>" of the bytes
  std::string path;    // the file the probe opens
  bool fresh = false;  // true: `path` is a temp file written by Stage; false:
                       // an intact store copy already existed
};

// What CollectGarbage removed from (and left in) the module store.
struct GcOutcome {
  uint64_t files_removed = 0;
  uint64_t bytes_removed = 0;
  uint64_t files_kept = 0;
  uint64_t bytes_kept = 0;
};

// Stores, checks and loads modules for the registry; implemented by
// ModuleLoader over the module store, faked in unit tests.
class HandlerLoader {
 public:
  virtual ~HandlerLoader() = default;
  // Writes `bytes`, whose digest ("sha256:<hex>", computed by the caller)
  // is `digest`, to a private fsynced temp file beside the store, unless an
  // intact store copy exists. INTERNAL on I/O failure.
  virtual absl::StatusOr<StagedModule> Stage(const std::string& bytes,
                                             const std::string& digest) = 0;
  // Checks (out of process) that `func_name` in the staged module is an XLA
  // FFI handler the daemon can host. INVALID_ARGUMENT/NOT_FOUND otherwise.
  virtual absl::StatusOr<HandlerInfo> Probe(const StagedModule& staged,
                                            const std::string& func_name) = 0;
  // Makes a fresh staged file the store copy of its digest (rename, fsync).
  virtual absl::Status Commit(const StagedModule& staged) = 0;
  // Removes the temp file of a fresh staged module that was not committed.
  // (A committed copy no entry references is left to RemoveUnreferenced: a
  // concurrent registration of the same bytes may be using it.)
  virtual void Discard(const StagedModule& staged) = 0;
  // Checks that the store copy executors will load is in place. kregd
  // itself never dlopens a module (DESIGN §8): executors do.
  virtual absl::Status Check(const std::string& digest) = 0;
  // Like Check, for a journaled entry at start-up: also verifies that the
  // store file still has the digest (DATA_LOSS otherwise).
  virtual absl::Status CheckStored(const std::string& digest) = 0;
  // Removes every store file whose digest is not in `keep`, and leftover
  // temp files. INTERNAL when the store cannot be listed.
  virtual absl::StatusOr<GcOutcome> RemoveUnreferenced(
      const std::set<std::string>& keep) = 0;
};

// Durable log of accepted registrations and retirements; implemented by
// Journal. A change is acknowledged only after its Append returned OK.
class RegistrationLog {
 public:
  virtual ~RegistrationLog() = default;
  // Appends and fsyncs.
  virtual absl::Status Append(const TargetEntry& entry) = 0;
  virtual absl::Status AppendRetirement(const Retirement& retirement) = 0;
  // A reservation made, or (`lifted`) lifted.
  virtual absl::Status AppendReservation(const NameReservation& reservation,
                                         bool lifted) = 0;
};

// Per-uid limits, checked before anything is stored. Root is exempt.
struct RegistryLimits {
  uint64_t max_registrations_per_uid = 1024;
  uint64_t max_store_bytes_per_uid = 4ull << 30;
  // Besides root, the uid that may run CollectGarbage (kregd's own).
  uid_t admin_uid = static_cast<uid_t>(-1);
  // `replace = "owner"` (docs/replace.md): replace=true by a module
  // target's owner or root makes its next generation. False: "deny".
  bool replace_by_owner = false;
  // How long a replacement waits for the live holders to switch
  // (docs/replace.md section 5; config key replace_timeout).
  absl::Duration replace_timeout = absl::Seconds(10);
  // Live generations a target may have (docs/replace.md section 2; config
  // key max_generations_per_target, 2 or more): the current one, the one it
  // replaced and every earlier one a live process holds or pins.
  uint32_t max_generations_per_target = 8;
};

// Replacements by outcome (kregd_replaces_total): every live holder switched
// (done), some did not within replace_timeout (timeout: the generation is
// committed all the same), or the replacement was refused.
struct ReplaceCounts {
  uint64_t done = 0;
  uint64_t timeout = 0;
  uint64_t refused = 0;
};

// Thread-safe. Decisions are made under one short lock; the slow work (the
// probe child, store writes and fsyncs, the journal, etcd) runs outside it
// while the decided key is reserved, so requests for other names proceed.
// Requests for a reserved key wait for it and then decide again: concurrent
// identical registrations give one load and N successes, conflicting ones
// exactly one winner. Entries are removed only by Retire (and in cluster
// mode by Mirror/Unmirror).
class Registry {
 public:
  // `loader` and `log` must outlive the registry. `limits.admin_uid`
  // defaults to the process's effective uid.
  Registry(HandlerLoader* loader, RegistrationLog* log,
           RegistryLimits limits = {});
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // OK with created=true (new), OK with created=false (identical no-op),
  // FAILED_PRECONDITION (content change under an existing key, or another
  // uid's module equal only by content_id; the message names both
  // identities and the remedy), INVALID_ARGUMENT (a "sha256:" content_id
  // that is not the module's digest), RESOURCE_EXHAUSTED (a per-uid limit),
  // or the loader's/log's error. Every decision is logged at info. A module
  // reaches the store only once its registration is accepted.
  // With limits.replace_by_owner, replace=true with other content makes the
  // next generation (created=true; docs/replace.md): PERMISSION_DENIED
  // naming the owner unless `args.peer` is the owner or root,
  // FAILED_PRECONDITION for an in-process target, for a handler whose FFI
  // API major or traits differ from the current generation's;
  // RESOURCE_EXHAUSTED naming the holders when the target would have more
  // than limits.max_generations_per_target live generations (earlier
  // generations no live process holds are dropped, checked before the
  // module is stored);
  // the authority's errors in cluster mode. Once committed, the repointer
  // (if set) moves the live holders, and in cluster mode every other host
  // its own (BindingAuthority::AwaitPeerAcks, outside the key's hold);
  // DEADLINE_EXCEEDED naming those that did not switch within
  // replace_timeout (the generation stays committed).
  absl::StatusOr<RegisterOutcome> Register(const RegisterArgs& args);

  // Removes (target_name, platform), or every platform under the name when
  // `platform` is empty, so the name can be registered again with any
  // content; journaled first. NOT_FOUND when nothing is registered,
  // PERMISSION_DENIED unless `peer` is root or the registering uid,
  // FAILED_PRECONDITION (naming the pids) while a live session has it bound.
  // All-or-nothing for the checks. Returns the retired entries. A module
  // no entry references any more leaves the store once the retirement is
  // journaled and no registration is in progress.
  absl::StatusOr<std::vector<EntryPtr>> Retire(const std::string& name,
                                               std::optional<Platform> platform,
                                               const PeerCred& peer);

  // Reserves `r.pattern` for `r.owner` (docs/operator-guide.md, "Name
  // reservations"), replacing an earlier reservation of the same pattern;
  // journaled first. PERMISSION_DENIED unless `peer` is root or
  // limits.admin_uid; FAILED_PRECONDITION naming them while targets the
  // pattern matches are registered by others than the owner. In cluster
  // mode published to every host first (the authority's errors).
  absl::Status Reserve(NameReservation r, const PeerCred& peer);
  // Lifts the reservation of `pattern`; NOT_FOUND when there is none.
  absl::Status Unreserve(const std::string& pattern, const PeerCred& peer);
  std::vector<NameReservation> Reservations() const;
  // Start-up: a journaled reservation in effect.
  void RestoreReservation(const NameReservation& r);
  // Cluster mode: a reservation made (or lifted) on some host, journaled
  // and put in effect here.
  absl::Status MirrorReservation(const NameReservation& r, bool lifted);

  // Removes store files no entry references (kregd runs it once at start,
  // after the journal is replayed). Waits for the registrations in progress
  // (holding back new ones) so that none loses a file it staged.
  // PERMISSION_DENIED unless `peer` is root or limits.admin_uid.
  absl::StatusOr<GcOutcome> CollectGarbage(const PeerCred& peer);

  // Consulted by Retire; null (the default) means nothing is ever bound.
  // The oracle must outlive the registry. Thread-safe.
  void SetBindingOracle(BindingOracle* oracle) { oracle_.store(oracle); }
  // Consulted by a replacement once its generation is committed, while the
  // name stays reserved (two replacements never interleave). Null (the
  // default): nothing is re-pointed. Must outlive the registry.
  void SetRepointer(Repointer* repointer) { repointer_.store(repointer); }

  // Cluster mode (DESIGN §10): a new binding is claimed from `authority`
  // before it is committed, and a retirement released there first. Null
  // (the default): this registry decides alone. Set before serving; the
  // authority must outlive the registry.
  void SetBindingAuthority(BindingAuthority* authority) {
    authority_.store(authority);
  }

  // Whether a registration of `key` with module `digest` is in progress
  // here (cluster mode: its own copy is about to be committed, so a
  // binding of the same module need not be fetched from a peer).
  bool Registering(const TargetKey& key, const std::string& digest) const;

  // Cluster mode: makes `binding` (made by the authority, e.g. on another
  // host) the local entry of its key, journaled. `module_bytes` are its
  // module's bytes, or empty when the store already holds them. A local
  // entry with other content is logged as a conflict and replaced: the
  // cluster's binding wins for new sessions; except that a higher
  // generation of the same owner's target is its replacement (no conflict;
  // journaled with its generations) and a lower one is ignored
  // (docs/replace.md §9). INVALID_ARGUMENT/DATA_LOSS when
  // the bytes are not the binding's module, the loader's errors otherwise.
  absl::Status Mirror(const TargetEntry& binding,
                      const std::string& module_bytes);
  // Cluster mode: stores `bytes`, the module of an earlier generation of a
  // mirrored binding (fetched from a peer, for pins: docs/replace.md §7),
  // when the store lacks it. DATA_LOSS when they are not module `digest`;
  // the loader's errors otherwise.
  absl::Status StoreModule(const std::string& digest, const std::string& bytes);
  // Cluster mode: the binding of `retired.key` with `retired`'s content was
  // removed by the authority (retired elsewhere, or gone at reconcile):
  // retires the local entry if it is still that content. Journaled.
  absl::Status Unmirror(const TargetEntry& retired, const std::string& why);
  // Cluster mode: this host could not take `binding` (generation 2 or
  // later: a replacement) for `why`; acknowledges it with that error, and
  // the pids that keep holding the generation this host has.
  void MirrorFailed(const TargetEntry& binding, const std::string& why);

  // Re-inserts a journaled entry at start-up (loads its module again).
  // If the module cannot be loaded (e.g. DATA_LOSS: corrupt store file) the
  // entry is still inserted, without a handler, so the name stays reserved;
  // an identical re-registration repairs it. A second record for the same
  // key with other content is refused exactly like a live registration.
  absl::Status Restore(const TargetEntry& entry);

  // Null when absent.
  EntryPtr Lookup(const TargetKey& key) const;
  std::vector<EntryPtr> List() const;
  // Every platform registered under `name`.
  std::vector<EntryPtr> Find(const std::string& name) const;

  // Before a `size`-byte upload for `key` is read: RESOURCE_EXHAUSTED (the
  // message registration would give) when no bytes of that size could fit
  // `peer.uid`'s limits — a new name past max_registrations_per_uid, or
  // `size` more store bytes past max_store_bytes_per_uid while the uid holds
  // no module of that size (which the upload might repeat). OK otherwise:
  // the registration checks again with the digest.
  absl::Status PrecheckUpload(const TargetKey& key, uint64_t size,
                              const PeerCred& peer) const;

  uint64_t refused() const { return refused_.load(); }
  ReplaceCounts replaces() const {
    return {replaces_done_.load(), replaces_timeout_.load(),
            replaces_refused_.load()};
  }

 private:
  // A key being worked on outside mu_ (a registration, retirement or
  // mirror). Requests for the key wait until it is released; a new name's
  // reservation counts against its uid's limits like an entry.
  struct Pending {
    uid_t uid = 0;
    std::string digest;
    uint64_t size = 0;
  };
  // Releases its reserved keys on destruction (and runs a sweep of the
  // store that became owed while keys were reserved).
  class Hold {
   public:
    Hold(Registry* registry, std::vector<TargetKey> keys)
        : registry_(registry), keys_(std::move(keys)) {}
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    ~Hold() { registry_->Release(keys_); }

   private:
    Registry* const registry_;
    const std::vector<TargetKey> keys_;
  };

  // Waits (mu_ held) until none of `keys` is reserved and no sweep runs or
  // waits; the caller then decides and reserves (pending_) what it works on.
  void AwaitFree(const std::vector<TargetKey>& keys)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Release(const std::vector<TargetKey>& keys) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits (mu_ held) until nothing is reserved or swept, holding back new
  // reservations meanwhile (gc, Reserve).
  void AwaitIdle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A store file may have lost its last reference (a retirement, a failed
  // registration after its commit): the store is swept once no key is
  // reserved (a reserved registration may be using the file).
  void OweSweep() ABSL_LOCKS_EXCLUDED(mu_);
  EntryPtr LookupLocked(const TargetKey& key) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The reservation in `reservations` of someone else that matches
  // `key.name`, if any (root is never refused); `groups`: the caller's
  // groups, or nullptr to look them up when needed.
  static std::optional<NameReservation> ReservedForOthers(
      const std::map<std::string, NameReservation>& reservations,
      const TargetKey& key, const PeerCred& peer,
      const std::vector<gid_t>* groups);
  // The refusal of `args` by the reservations and the entry as they are
  // now, else OK: one peek under mu_, the NSS lookups (the caller's groups,
  // a holder's name) outside it. Sets `groups` to the caller's groups when
  // a group's reservation matched (for the decision under mu_).
  absl::Status RefusalNow(const RegisterArgs& args, const std::string& cid,
                          const std::string& digest,
                          std::optional<std::vector<gid_t>>* groups) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // PERMISSION_DENIED naming `r`'s owner (an NSS lookup: not under mu_).
  static absl::Status ReservedRefusal(const TargetKey& key,
                                      const NameReservation& r,
                                      const PeerCred& peer);
  // The admin check of Reserve, Unreserve and CollectGarbage.
  absl::Status CheckAdmin(const PeerCred& peer, const char* what) const;

  absl::Status CheckSame(const TargetEntry& existing, TargetKind kind,
                         const std::string& cid, const std::string& func_name,
                         bool replace) const;
  // CheckSame, then (equal by content_id) that another uid brings the
  // owner's module bytes. Other content that `args` may replace under the
  // policy (MayReplace) is OK with `*replacing` set.
  absl::Status CheckIdentity(const TargetEntry& existing,
                             const RegisterArgs& args, const std::string& cid,
                             const std::string& digest, bool* replacing) const;
  // The generations `existing`'s replacement keeps (the current one and
  // those the oracle's live processes hold), or RESOURCE_EXHAUSTED when
  // they and the new one are over limits.max_generations_per_target.
  absl::StatusOr<std::vector<Generation>> LiveGenerations(
      const TargetEntry& existing) const;
  // Whether `args` (replace=true, other content) may replace `existing`:
  // its owner or root, module targets only.
  absl::Status MayReplace(const TargetEntry& existing,
                          const RegisterArgs& args) const;
  // The work of a reserved replacement, outside mu_: journal and publish
  // the next generation of `existing` (registry_replace.cc).
  absl::StatusOr<RegisterOutcome> Replace(const RegisterArgs& args,
                                          const std::string& digest,
                                          const std::string& cid,
                                          const EntryPtr& existing);
  // The end of a replacement, once the key's hold is released: in cluster
  // mode the other hosts' acknowledgements; DEADLINE_EXCEEDED naming the
  // processes (and hosts) that did not switch (registry_replace.cc).
  absl::StatusOr<RegisterOutcome> AwaitSwitched(RegisterOutcome out);
  // Cluster mode: acknowledges (BindingAuthority::PublishAck) a mirrored
  // generation 2 or later of `binding`, with this host's `laggards`.
  void Acknowledge(const TargetEntry& binding,
                   const std::vector<Repointer::Laggard>& laggards);
  // Register without the decision log.
  absl::StatusOr<RegisterOutcome> Decide(const RegisterArgs& args,
                                         const std::string& digest);
  // What one uid's registrations (and reservations of new names) hold: how
  // many, the distinct module digests (with their sizes), their bytes.
  struct UidUse {
    uint64_t registrations = 0;
    uint64_t bytes = 0;
    std::map<std::string, uint64_t> digests;
  };
  UidUse UseOf(uid_t uid) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED when registering `size` more bytes of `digest`
  // (and with `new_name` one more registration) would take `peer.uid`
  // over a limit.
  absl::Status CheckLimits(const RegisterArgs& args, const std::string& digest,
                           bool new_name) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  // The work of a reserved registration, outside mu_:
  // Stage, probe, commit, journal and publish a new module entry (or
  // repair `existing`).
  absl::StatusOr<RegisterOutcome> RegisterModule(const RegisterArgs& args,
                                                 const std::string& digest,
                                                 const std::string& cid,
                                                 EntryPtr existing);
  // Journal and publish an in-process target (nothing to load).
  absl::StatusOr<RegisterOutcome> RegisterInProcess(const RegisterArgs& args);
  // Cluster mode: the rest of Register for a key with no local entry.
  absl::StatusOr<RegisterOutcome> RegisterClaimed(const RegisterArgs& args,
                                                  const std::string& digest,
                                                  const std::string& cid,
                                                  BindingAuthority* authority);
  // A request equal to the cluster's `binding` by content_id but with other
  // module bytes: the local entry becomes the binding, with its module
  // fetched from a peer.
  absl::StatusOr<RegisterOutcome> AdoptClaimed(const RegisterArgs& args,
                                               const TargetEntry& binding,
                                               BindingAuthority* authority);
  // Stage, probe, commit, journal and publish `entry` with `bytes` (which
  // must be its module).
  // `journal` false: a repair of an entry the journal already has.
  // `replaces`: the generation `entry` replaces; in cluster mode it is
  // replaced in the authority (compare-and-swap) once `entry` is probed and
  // stored, before it is journaled here.
  absl::StatusOr<EntryPtr> Install(const TargetEntry& entry,
                                   const std::string& bytes,
                                   bool journal = true,
                                   const TargetEntry* replaces = nullptr);
  // A replacement's probed handler (`info`) against the generation before
  // `next`'s last: FAILED_PRECONDITION naming both when the FFI API major
  // or the traits differ.
  static absl::Status CheckCompatible(const TargetEntry& next,
                                      const HandlerInfo& info);
  // Journal and publish `entry` (module already in place, or in-process).
  absl::StatusOr<EntryPtr> Insert(const TargetEntry& entry);
  // Journals the retirement of `entry` by `by` and removes it.
  absl::Status Remove(const EntryPtr& entry, const PeerCred& by);
  // Removes every store file (and temp file) no entry references. Called
  // with sweeping_ set (so nothing is reserved meanwhile); clears it.
  absl::StatusOr<GcOutcome> SweepStore();

  HandlerLoader* const loader_;
  RegistrationLog* const log_;
  const RegistryLimits limits_;
  std::atomic<BindingOracle*> oracle_{nullptr};
  std::atomic<BindingAuthority*> authority_{nullptr};
  std::atomic<Repointer*> repointer_{nullptr};
  mutable absl::Mutex mu_;
  std::map<TargetKey, EntryPtr> entries_ ABSL_GUARDED_BY(mu_);
  std::map<TargetKey, Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, NameReservation> reservations_ ABSL_GUARDED_BY(mu_);
  bool sweep_owed_ ABSL_GUARDED_BY(mu_) = false;
  bool sweeping_ ABSL_GUARDED_BY(mu_) = false;
  int idle_waiters_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> replaces_done_{0};
  std::atomic<uint64_t> replaces_timeout_{0};
  // Counted by CheckIdentity (const), hence mutable.
  mutable std::atomic<uint64_t> replaces_refused_{0};
};

}  // namespace kreg

#endif  // KREGD_DAEMON_REGISTRY_REGISTRY_H_
