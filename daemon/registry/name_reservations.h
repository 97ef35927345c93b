// Operators' reservations of target names for a uid or a group
// (docs/operator-guide.md, "Name reservations"): a collaborator of the
// Registry core, the admission policy its decisions consult.
#ifndef KREGD_DAEMON_REGISTRY_NAME_RESERVATIONS_H_
#define KREGD_DAEMON_REGISTRY_NAME_RESERVATIONS_H_

#include <atomic>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/base/types.h"
#include "daemon/registry/binding_authority.h"
#include "daemon/registry/registry.h"

namespace kreg {

// Durable log of reservations; implemented by Journal.
class ReservationLog {
 public:
  virtual ~ReservationLog() = default;
  // A reservation made, or (`lifted`) lifted. Appends and fsyncs.
  virtual absl::Status AppendReservation(const NameReservation& reservation,
                                         bool lifted) = 0;
};

// Thread-safe. Adds itself to `registry`'s admission policies; `registry`
// and `log` must outlive it.
class NameReservations : public AdmissionPolicy {
 public:
  NameReservations(Registry* registry, ReservationLog* log);
  NameReservations(const NameReservations&) = delete;
  NameReservations& operator=(const NameReservations&) = delete;

  // Cluster mode (DESIGN §10): a reservation is published to every host
  // before it is made here. Set before serving; must outlive this.
  void SetBindingAuthority(BindingAuthority* authority) {
    authority_.store(authority);
  }

  // Reserves `r.pattern` for `r.owner`, replacing an earlier reservation
  // of the same pattern; journaled first. PERMISSION_DENIED unless `peer`
  // is root or the registry's admin uid; FAILED_PRECONDITION naming them
  // while targets the pattern matches are registered by others than the
  // owner. In cluster mode published to every host first (the authority's
  // errors).
  absl::Status Reserve(NameReservation r, const PeerCred& peer);
  // Lifts the reservation of `pattern`; NOT_FOUND when there is none.
  absl::Status Unreserve(const std::string& pattern, const PeerCred& peer);
  std::vector<NameReservation> List() const;
  // Start-up: a journaled reservation in effect.
  void Restore(const NameReservation& r);
  // Cluster mode: a reservation made (or lifted) on some host, journaled
  // and put in effect here.
  absl::Status Mirror(const NameReservation& r, bool lifted);

  // AdmissionPolicy: PERMISSION_DENIED naming the owner when a reservation
  // of someone else matches the name (root is never refused).
  absl::Status Screen(const RegisterArgs& args,
                      AdmissionNote* note) const override;
  absl::Status Admit(const RegisterArgs& args,
                     const AdmissionNote& note) const override;

 private:
  Registry* const registry_;
  ReservationLog* const log_;
  std::atomic<BindingAuthority*> authority_{nullptr};
  mutable absl::Mutex mu_;
  std::map<std::string, NameReservation> reservations_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kreg

#endif  // KREGD_DAEMON_REGISTRY_NAME_RESERVATIONS_H_
