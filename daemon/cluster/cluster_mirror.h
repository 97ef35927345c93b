// The registry in cluster mode (DESIGN §10), as a collaborator of the
// Registry core: a new binding is claimed from the BindingAuthority (etcd)
// before it is committed here, a replacement is swapped there, a
// retirement released there first; and bindings made on other hosts are
// mirrored into the local registry and journal.
#ifndef KREGD_DAEMON_CLUSTER_CLUSTER_MIRROR_H_
#define KREGD_DAEMON_CLUSTER_CLUSTER_MIRROR_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/base/types.h"
#include "daemon/registry/binding_authority.h"
#include "daemon/registry/name_reservations.h"
#include "daemon/registry/registry.h"
#include "daemon/registry/replacement.h"

namespace kreg {

// Thread-safe. Attaches itself to `registry` (its key binder and an install
// hook), `reservations` and `replacement` (their authority) on
// construction: build it before serving. Everything passed must outlive it.
class ClusterMirror : public KeyBinder, public InstallHook {
 public:
  ClusterMirror(Registry* registry, NameReservations* reservations,
                Replacement* replacement, BindingAuthority* authority);
  ClusterMirror(const ClusterMirror&) = delete;
  ClusterMirror& operator=(const ClusterMirror&) = delete;

  Registry& registry() { return *registry_; }

  // Whether a registration of `key` with module `digest` is in progress
  // here (its own copy is about to be committed, so a binding of the same
  // module need not be fetched from a peer).
  bool Registering(const TargetKey& key, const std::string& digest) const {
    return registry_->InProgress(key, digest);
  }

  // Makes `binding` (made by the authority, e.g. on another host) the local
  // entry of its key, journaled. `module_bytes` are its module's bytes, or
  // empty when the store already holds them. A local entry with other
  // content is logged as a conflict and replaced: the cluster's binding
  // wins for new sessions; except that a higher generation of the same
  // owner's target is its replacement (no conflict; journaled with its
  // generations) and a lower one is ignored (docs/replace.md §9).
  // INVALID_ARGUMENT/DATA_LOSS when the bytes are not the binding's module,
  // the loader's errors otherwise.
  absl::Status Mirror(const TargetEntry& binding,
                      const std::string& module_bytes);
  // Stores `bytes`, the module of an earlier generation of a mirrored
  // binding (fetched from a peer, for pins: docs/replace.md §7), when the
  // store lacks it. DATA_LOSS when they are not module `digest`; the
  // loader's errors otherwise.
  absl::Status StoreModule(const std::string& digest, const std::string& bytes);
  // The binding of `retired.key` with `retired`'s content was removed by
  // the authority (retired elsewhere, or gone at reconcile): retires the
  // local entry if it is still that content. Journaled.
  absl::Status Unmirror(const TargetEntry& retired, const std::string& why);
  // This host could not take `binding` (generation 2 or later: a
  // replacement) for `why`; acknowledges it with that error, and the pids
  // that keep holding the generation this host has.
  void MirrorFailed(const TargetEntry& binding, const std::string& why);
  // A reservation made (or lifted) on some host, journaled and put in
  // effect here.
  absl::Status MirrorReservation(const NameReservation& r, bool lifted) {
    return reservations_->Mirror(r, lifted);
  }

  // KeyBinder: the rest of a registration of a key with no local entry:
  // claimed from the authority first (the authority's errors; the core's
  // identity refusal against a binding made elsewhere).
  absl::StatusOr<RegisterOutcome> BindNew(const RegisterArgs& args,
                                          const std::string& digest,
                                          const std::string& cid) override;
  // InstallHook: a replacement is made for every host or not at all
  // (BindingAuthority::Replace), a retirement released everywhere first.
  absl::Status Committing(TargetEntry* entry,
                          const TargetEntry* previous) override;
  void Committed(const TargetEntry& entry) override;
  absl::Status Retiring(const TargetEntry& entry) override;

 private:
  // A request equal to the cluster's `binding` by content_id but with other
  // module bytes: the local entry becomes the binding, with its module
  // fetched from a peer.
  absl::StatusOr<RegisterOutcome> Adopt(const RegisterArgs& args,
                                        const TargetEntry& binding);
  // Acknowledges (BindingAuthority::PublishAck) a mirrored generation 2 or
  // later of `binding`, with this host's `laggards`.
  void Acknowledge(const TargetEntry& binding,
                   const std::vector<Repointer::Laggard>& laggards);

  Registry* const registry_;
  NameReservations* const reservations_;
  Replacement* const replacement_;
  BindingAuthority* const authority_;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_CLUSTER_CLUSTER_MIRROR_H_
