// Who else must agree before a binding is made: in cluster mode (DESIGN
// §10) the cluster-wide registry in etcd; consulted by Registry. Without an
// authority (a standalone kregd) the registry decides alone.
#ifndef KREGD_DAEMON_REGISTRY_BINDING_AUTHORITY_H_
#define KREGD_DAEMON_REGISTRY_BINDING_AUTHORITY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/base/types.h"
#include "daemon/registry/repointer.h"

namespace kreg {

// The answer to a claim: this claim made the binding, or the binding that
// already exists (which the registry compares with the request under the
// rules of DESIGN §2).
struct ClaimResult {
  bool created = false;
  TargetEntry existing;  // when !created
};

// What the other hosts reported about a replacement (docs/replace.md §9).
struct PeerAcks {
  // Their processes that did not switch, each with its host.
  std::vector<Repointer::Laggard> laggards;
  // A host that did not report in time (`why` empty), or reported that it
  // could not take the generation (`why`: its error).
  struct Host {
    std::string host;  // "NAME (ADDRESS)"; empty: the hosts were not known
    std::string why;
  };
  std::vector<Host> hosts;
};

// Implemented by ClusterRegistry. Thread-safe; must not call back into the
// registry from these calls.
class BindingAuthority {
 public:
  virtual ~BindingAuthority() = default;

  // The name recorded as TargetEntry::host in the bindings this kregd makes.
  virtual std::string HostName() const = 0;

  // Creates the binding of `proposed.key` unless one exists (atomically,
  // for every host). UNAVAILABLE when the authority cannot be reached: the
  // registry must then refuse, never bind locally only.
  virtual absl::StatusOr<ClaimResult> Claim(const TargetEntry& proposed) = 0;

  // Replaces the binding `current` (generation g, as this host has it) by
  // `next` (generation g+1, docs/replace.md §9), atomically for every host:
  // only while the authority still holds `current` (compare-and-swap).
  // ABORTED naming the binding it holds now when another host replaced or
  // rebound it meanwhile; FAILED_PRECONDITION when it holds no binding of
  // the key; UNAVAILABLE when it cannot be reached.
  virtual absl::Status Replace(const TargetEntry& current,
                               const TargetEntry& next) = 0;

  // `entry` is committed here now (a registration, an adopted binding or a
  // replacement): what this host holds changed, for the peers that look
  // for a module's holders (docs/operator-guide.md, "Cluster mode").
  virtual void Committed(const TargetEntry& entry) { (void)entry; }

  // Undoes a claim that made a binding (`claimed`) whose local commit then
  // failed. Best effort: a failure is logged.
  virtual void Unclaim(const TargetEntry& claimed) = 0;

  // Removes the binding of `entry` everywhere (retirement), if it is still
  // that binding. UNAVAILABLE when the authority cannot be reached.
  virtual absl::Status Release(const TargetEntry& entry) = 0;

  // Makes (or with `lifted`, lifts) name reservation `r` on every host.
  // UNAVAILABLE when the authority cannot be reached: the registry then
  // refuses, never reserving locally only.
  virtual absl::Status PublishReservation(const NameReservation& r,
                                          bool lifted) = 0;

  // Records, for the hosts that wait in AwaitPeerAcks, that this host
  // re-pointed its holders of `entry.key` to `entry.generation` and which
  // of them did not switch, or (`error` set) that it could not take that
  // generation. Best effort: a failure is logged.
  virtual void PublishAck(const TargetEntry& entry,
                          const std::vector<Repointer::Laggard>& laggards,
                          const std::string& error) = 0;

  // Waits until every other live host acknowledged `entry.generation` of
  // `entry.key` (PublishAck) or `deadline` passed: the processes they
  // reported that run an earlier generation, and the hosts that did not
  // report or could not take it. Empty when all switched.
  virtual PeerAcks AwaitPeerAcks(const TargetEntry& entry,
                                 absl::Time deadline) = 0;

  // The bytes of module `digest` (`size` bytes) from a peer that holds it,
  // their digest verified: NOT_FOUND when no peer has it, DATA_LOSS when
  // the only copies offered had other bytes, UNAVAILABLE when no peer
  // answered.
  virtual absl::StatusOr<std::string> FetchModule(const std::string& digest,
                                                  uint64_t size) = 0;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_REGISTRY_BINDING_AUTHORITY_H_
