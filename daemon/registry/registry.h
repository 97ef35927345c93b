// The core of kregd's (target_name, platform) -> handler registry (DESIGN
// §2, docs/design.md "The registry"): entries, per-key holds, the decision,
// install and removal, per-uid quotas and the store sweep. Features are
// collaborators that use this API and the small extension points below
// (registration_service.h composes them); the core names none of them.
#ifndef KREGD_DAEMON_REGISTRY_REGISTRY_H_
#define KREGD_DAEMON_REGISTRY_REGISTRY_H_

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/base/types.h"
#include "daemon/registry/binding_oracle.h"
#include "daemon/registry/extension_points.h"
#include "daemon/registry/handler_loader.h"
#include "daemon/registry/register_args.h"

namespace kreg {

// Durable log of accepted entries and retirements; implemented by Journal.
// A change is acknowledged only after its Append returned OK.
class EntryLog {
 public:
  virtual ~EntryLog() = default;
  // Appends and fsyncs.
  virtual absl::Status Append(const TargetEntry& entry) = 0;
  virtual absl::Status AppendRetirement(const Retirement& retirement) = 0;
};

// Per-uid limits, checked before anything is stored. Root is exempt.
struct QuotaLimits {
  uint64_t max_registrations_per_uid = 1024;
  uint64_t max_store_bytes_per_uid = 4ull << 30;
  // Besides root, the uid that may run the admin operations (CheckAdmin).
  uid_t admin_uid = static_cast<uid_t>(-1);
};

// Thread-safe. Decisions are made under one short lock; the slow work (the
// probe child, store writes and fsyncs, the journal, collaborators) runs
// outside it while the decided key is held, so requests for other names
// proceed. Requests for a held key wait for it and then decide again:
// concurrent identical registrations give one load and N successes,
// conflicting ones exactly one winner.
class Registry {
 public:
  // Releases its held keys on destruction (and runs a sweep of the store
  // that became owed while keys were held).
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

  // `loader` and `log` must outlive the registry. `limits.admin_uid`
  // defaults to the process's effective uid.
  Registry(HandlerLoader* loader, EntryLog* log, QuotaLimits limits = {});
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Extension points; added before serving, must outlive the registry.
  void AddAdmission(AdmissionPolicy* policy);
  void SetChangePolicy(ChangePolicy* policy) { change_.store(policy); }
  void AddInstallHook(InstallHook* hook);
  void SetKeyBinder(KeyBinder* binder) { binder_.store(binder); }
  // Consulted by Retire; null (the default): nothing is ever bound.
  void SetBindingOracle(BindingOracle* oracle) { oracle_.store(oracle); }
  BindingOracle* oracle() const { return oracle_.load(); }

  // OK with created=true (new), OK with created=false (identical no-op),
  // FAILED_PRECONDITION (content change under an existing key, or another
  // uid's module equal only by content_id; the message names both
  // identities and the remedy), INVALID_ARGUMENT (a "sha256:" content_id
  // that is not the module's digest), RESOURCE_EXHAUSTED (a per-uid limit),
  // an admission policy's or change policy's refusal, or the loader's/log's
  // error. Every decision is logged at info. A module reaches the store
  // only once its registration is accepted.
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

  // Removes store files no entry references (kregd runs it once at start,
  // after the journal is replayed). Waits for the registrations in progress
  // (holding back new ones) so that none loses a file it staged.
  // PERMISSION_DENIED unless `peer` is root or limits.admin_uid.
  absl::StatusOr<GcOutcome> CollectGarbage(const PeerCred& peer);

  // Re-inserts a journaled entry at start-up (loads its module again).
  // If the module cannot be loaded (e.g. DATA_LOSS: corrupt store file) the
  // entry is still inserted, without a handler, so the name stays taken;
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

  // --- For collaborators ---

  // PERMISSION_DENIED ("`what` is for root or kregd's own uid") unless
  // `peer` is root or limits.admin_uid.
  absl::Status CheckAdmin(const PeerCred& peer, const char* what) const;
  // Waits until `key` is free, then asks `take` (under the lock) with the
  // key's entry (null when none): true holds the key, counted against
  // `uid` with module `digest` of `size` bytes, until the Hold is gone.
  std::unique_ptr<Hold> HoldKey(
      const TargetKey& key,
      absl::FunctionRef<bool(const EntryPtr&, uid_t*, std::string*, uint64_t*)>
          take);
  // Waits until no key is held (holding back new holds), then runs `fn`
  // under the lock with every entry: `fn` must not call into the registry.
  absl::Status WhileIdle(
      absl::FunctionRef<absl::Status(const std::vector<EntryPtr>&)> fn);
  // Whether a registration of `key` with module `digest` is in progress.
  bool InProgress(const TargetKey& key, const std::string& digest) const;
  // The core's refusal of `kind` content `cid`/`func_name` under
  // `existing`'s key by `request` (null: at start-up), with the change
  // policy's hint; OK when identical.
  absl::Status CheckSame(const TargetEntry& existing, TargetKind kind,
                         const std::string& cid, const std::string& func_name,
                         const RegisterArgs* request) const;
  // CheckSame, then (equal by content_id) that another uid brings the
  // owner's module bytes; other content the change policy takes is OK with
  // `*changing` set.
  absl::Status CheckIdentity(const TargetEntry& existing,
                             const RegisterArgs& args, const std::string& cid,
                             const std::string& digest, bool* changing) const;
  // Stage, probe, commit, journal and publish `entry` with `bytes` (which
  // must be its module; DATA_LOSS otherwise), around the install hooks.
  // `journal` false: a repair of an entry the journal already has.
  // `previous`: the entry `entry` follows (for the hooks).
  absl::StatusOr<EntryPtr> Install(const TargetEntry& entry,
                                   const std::string& bytes,
                                   bool journal = true,
                                   const TargetEntry* previous = nullptr);
  // Journal and publish `entry` (module already in place, or in-process).
  absl::StatusOr<EntryPtr> Insert(const TargetEntry& entry);
  // Journals the retirement of `entry` by `by` and removes it.
  absl::Status Remove(const EntryPtr& entry, const PeerCred& by);
  // A store file may have lost its last reference: the store is swept once
  // no key is held (a held registration may be using the file).
  void OweSweep() ABSL_LOCKS_EXCLUDED(mu_);
  void CountRefusal() { refused_.fetch_add(1); }
  std::vector<InstallHook*> hooks() const;
  HandlerLoader* loader() const { return loader_; }

  uint64_t refused() const { return refused_.load(); }

 private:
  // A key being worked on outside mu_. Requests for the key wait until it
  // is released; a new name's hold counts against its uid's limits like an
  // entry.
  struct Pending {
    uid_t uid = 0;
    std::string digest;
    uint64_t size = 0;
  };
  // What one uid's registrations (and holds of new names) hold: how many,
  // the distinct module digests (with their sizes), their bytes.
  struct UidUse {
    uint64_t registrations = 0;
    uint64_t bytes = 0;
    std::map<std::string, uint64_t> digests;
  };

  // Waits (mu_ held) until none of `keys` is held and no sweep runs or
  // waits; the caller then decides and holds (pending_) what it works on.
  void AwaitFree(const std::vector<TargetKey>& keys)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Release(const std::vector<TargetKey>& keys) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits (mu_ held) until nothing is held or swept, holding back new holds
  // meanwhile.
  void AwaitIdle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  EntryPtr LookupLocked(const TargetKey& key) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  std::vector<AdmissionPolicy*> admissions() const;
  // The refusal of `args` by the policies and the entry as they are now,
  // else OK, outside mu_ (one peek under it).
  absl::Status RefusalNow(const RegisterArgs& args, const std::string& cid,
                          const std::string& digest, AdmissionNote* note) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Register without the decision log.
  absl::StatusOr<RegisterOutcome> Decide(const RegisterArgs& args,
                                         const std::string& digest);
  UidUse UseOf(uid_t uid) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED when registering `size` more bytes of `digest`
  // (and with `new_name` one more registration) would take `peer.uid`
  // over a limit.
  absl::Status CheckLimits(const RegisterArgs& args, const std::string& digest,
                           bool new_name) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Stage, probe, commit, journal and publish a new module entry (or
  // repair `existing`), with the key held.
  absl::StatusOr<RegisterOutcome> RegisterModule(const RegisterArgs& args,
                                                 const std::string& digest,
                                                 const std::string& cid,
                                                 EntryPtr existing);
  // Journal and publish an in-process target (nothing to load).
  absl::StatusOr<RegisterOutcome> RegisterInProcess(const RegisterArgs& args);
  // Removes every store file (and temp file) no entry references. Called
  // with sweeping_ set (so nothing is held meanwhile); clears it.
  absl::StatusOr<GcOutcome> SweepStore();

  HandlerLoader* const loader_;
  EntryLog* const log_;
  const QuotaLimits limits_;
  std::atomic<BindingOracle*> oracle_{nullptr};
  std::atomic<ChangePolicy*> change_{nullptr};
  std::atomic<KeyBinder*> binder_{nullptr};
  mutable absl::Mutex hooks_mu_;
  std::vector<AdmissionPolicy*> admissions_ ABSL_GUARDED_BY(hooks_mu_);
  std::vector<InstallHook*> hooks_ ABSL_GUARDED_BY(hooks_mu_);
  mutable absl::Mutex mu_;
  std::map<TargetKey, EntryPtr> entries_ ABSL_GUARDED_BY(mu_);
  std::map<TargetKey, Pending> pending_ ABSL_GUARDED_BY(mu_);
  bool sweep_owed_ ABSL_GUARDED_BY(mu_) = false;
  bool sweeping_ ABSL_GUARDED_BY(mu_) = false;
  int idle_waiters_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> refused_{0};
};

}  // namespace kreg

#endif  // KREGD_DAEMON_REGISTRY_REGISTRY_H_
