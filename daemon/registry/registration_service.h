// The registry as kregd's front ends use it (docs/design.md "The
// registry"): the Registry core composed with its collaborators, name
// reservations and replacement. Composition only: every rule lives in the
// core or in a collaborator; the cluster mirror (daemon/cluster) attaches
// to the parts.
#ifndef KREGD_DAEMON_REGISTRY_REGISTRATION_SERVICE_H_
#define KREGD_DAEMON_REGISTRY_REGISTRATION_SERVICE_H_

#include <optional>
#include <string>
#include <vector>

#include "daemon/registry/name_reservations.h"
#include "daemon/registry/registry.h"
#include "daemon/registry/replacement.h"

namespace kreg {

// kregd's registry limits (its config keys): the core's quotas and
// replacement's limits.
struct RegistryLimits {
  uint64_t max_registrations_per_uid = 1024;
  uint64_t max_store_bytes_per_uid = 4ull << 30;
  // Besides root, the uid that may run gc and reserve names (kregd's own).
  uid_t admin_uid = static_cast<uid_t>(-1);
  // `replace = "owner"` (docs/replace.md).
  bool replace_by_owner = false;
  absl::Duration replace_timeout = absl::Seconds(10);
  uint32_t max_generations_per_target = 8;
};

// Durable log of everything the registry decides; implemented by Journal.
class RegistrationLog : public EntryLog, public ReservationLog {};

class RegistrationService {
 public:
  // `loader` and `log` must outlive the service.
  RegistrationService(HandlerLoader* loader, RegistrationLog* log,
                      RegistryLimits limits = {})
      : core_(loader, log,
              QuotaLimits{limits.max_registrations_per_uid,
                          limits.max_store_bytes_per_uid, limits.admin_uid}),
        reservations_(&core_, log),
        replacement_(&core_, ReplaceLimits{limits.replace_by_owner,
                                           limits.replace_timeout,
                                           limits.max_generations_per_target}) {
  }
  RegistrationService(const RegistrationService&) = delete;
  RegistrationService& operator=(const RegistrationService&) = delete;

  Registry& core() { return core_; }
  const Registry& core() const { return core_; }
  NameReservations& reservations() { return reservations_; }
  Replacement& replacement() { return replacement_; }

  // See Registry.
  absl::StatusOr<RegisterOutcome> Register(const RegisterArgs& args) {
    return core_.Register(args);
  }
  absl::StatusOr<std::vector<EntryPtr>> Retire(const std::string& name,
                                               std::optional<Platform> platform,
                                               const PeerCred& peer) {
    return core_.Retire(name, platform, peer);
  }
  absl::StatusOr<GcOutcome> CollectGarbage(const PeerCred& peer) {
    return core_.CollectGarbage(peer);
  }
  absl::Status Restore(const TargetEntry& entry) {
    return core_.Restore(entry);
  }
  EntryPtr Lookup(const TargetKey& key) const { return core_.Lookup(key); }
  std::vector<EntryPtr> List() const { return core_.List(); }
  std::vector<EntryPtr> Find(const std::string& name) const {
    return core_.Find(name);
  }
  absl::Status PrecheckUpload(const TargetKey& key, uint64_t size,
                              const PeerCred& peer) const {
    return core_.PrecheckUpload(key, size, peer);
  }
  uint64_t refused() const { return core_.refused(); }
  void SetBindingOracle(BindingOracle* oracle) {
    core_.SetBindingOracle(oracle);
  }

  // See NameReservations.
  absl::Status Reserve(NameReservation r, const PeerCred& peer) {
    return reservations_.Reserve(std::move(r), peer);
  }
  absl::Status Unreserve(const std::string& pattern, const PeerCred& peer) {
    return reservations_.Unreserve(pattern, peer);
  }
  std::vector<NameReservation> Reservations() const {
    return reservations_.List();
  }
  void RestoreReservation(const NameReservation& r) {
    reservations_.Restore(r);
  }

  // See Replacement.
  void SetRepointer(Repointer* repointer) {
    replacement_.SetRepointer(repointer);
  }
  ReplaceCounts replaces() const { return replacement_.counts(); }

 private:
  Registry core_;
  NameReservations reservations_;
  Replacement replacement_;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_REGISTRY_REGISTRATION_SERVICE_H_
