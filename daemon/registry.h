// The (target_name, platform) -> handler registry of kregd (DESIGN §2).
#ifndef KREGD_DAEMON_REGISTRY_H_
#define KREGD_DAEMON_REGISTRY_H_

#include <atomic>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/types.h"

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
};

// Loads and checks handlers for the registry; implemented by ModuleLoader
// over the module store, faked in unit tests.
class HandlerLoader {
 public:
  virtual ~HandlerLoader() = default;
  // Stores `bytes`, whose digest ("sha256:<hex>", computed by the caller)
  // is `digest`, unless an intact copy is there. INTERNAL on I/O failure.
  virtual absl::Status Store(const std::string& bytes,
                             const std::string& digest) = 0;
  // Checks (out of process) that `func_name` in the stored module is an XLA
  // FFI handler the daemon can host. INVALID_ARGUMENT/NOT_FOUND otherwise.
  virtual absl::StatusOr<HandlerInfo> Probe(const std::string& digest,
                                            const std::string& func_name) = 0;
  // Checks that the store copy executors will load is in place. kregd
  // itself never dlopens a module (DESIGN §8): executors do.
  virtual absl::Status Check(const std::string& digest) = 0;
  // Like Check, for a journaled entry at start-up: also verifies that the
  // store file still has the digest (DATA_LOSS otherwise).
  virtual absl::Status CheckStored(const std::string& digest) = 0;
};

// Durable log of accepted registrations; implemented by Journal.
class RegistrationLog {
 public:
  virtual ~RegistrationLog() = default;
  // Appends and fsyncs. The registration is acknowledged only after OK.
  virtual absl::Status Append(const TargetEntry& entry) = 0;
};

// Thread-safe. The whole check-and-register sequence is atomic: concurrent
// identical registrations give one load and N successes, conflicting ones
// exactly one winner. Entries are never removed.
class Registry {
 public:
  // `loader` and `log` must outlive the registry.
  Registry(HandlerLoader* loader, RegistrationLog* log);
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // OK with created=true (new), OK with created=false (identical no-op),
  // FAILED_PRECONDITION (content change under an existing key; the message
  // names both identities and the remedy), or the loader's/log's error.
  absl::StatusOr<RegisterOutcome> Register(const RegisterArgs& args);

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

  uint64_t refused() const { return refused_.load(); }

 private:
  absl::Status CheckSame(const TargetEntry& existing, TargetKind kind,
                         const std::string& cid, const std::string& func_name,
                         bool replace) const;
  // The new-entry half of Register for in-process targets (register_mu_
  // held): journal and insert, nothing to load.
  absl::StatusOr<RegisterOutcome> RegisterInProcess(const RegisterArgs& args)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(register_mu_);

  HandlerLoader* const loader_;
  RegistrationLog* const log_;
  // Serialises check-load-journal-insert; never held by readers.
  absl::Mutex register_mu_;
  mutable absl::Mutex mu_;
  std::map<TargetKey, EntryPtr> entries_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> refused_{0};
};

}  // namespace kreg

#endif  // KREGD_DAEMON_REGISTRY_H_
