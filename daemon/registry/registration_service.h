// The registry as kregd's front ends use it (docs/design.md "The
// registry"): the Registry core with its collaborators, name reservations
// and replacement, attached. Composition only: every rule lives in the
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

// The core itself (its API is the front ends'), with the collaborators
// attached at construction.
class RegistrationService : public Registry {
 public:
  // `loader` and `log` must outlive the service.
  RegistrationService(HandlerLoader* loader, RegistrationLog* log,
                      RegistryLimits limits = {})
      : Registry(loader, log,
                 QuotaLimits{limits.max_registrations_per_uid,
                             limits.max_store_bytes_per_uid, limits.admin_uid}),
        reservations_(this, log),
        replacement_(
            this, ReplaceLimits{limits.replace_by_owner, limits.replace_timeout,
                                limits.max_generations_per_target}) {}

  Registry& core() { return *this; }
  const Registry& core() const { return *this; }
  NameReservations& reservations() { return reservations_; }
  Replacement& replacement() { return replacement_; }

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
  NameReservations reservations_;
  Replacement replacement_;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_REGISTRY_REGISTRATION_SERVICE_H_
