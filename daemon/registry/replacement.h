// Replacing a target in place under `replace = "owner"` (docs/replace.md):
// a collaborator of the Registry core, its change policy. The next
// generation is installed through the core and journaled with both
// identities; the live holders are then re-pointed, and in cluster mode
// the other hosts' acknowledgements awaited (§9).
#ifndef KREGD_DAEMON_REGISTRY_REPLACEMENT_H_
#define KREGD_DAEMON_REGISTRY_REPLACEMENT_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/base/types.h"
#include "daemon/registry/binding_authority.h"
#include "daemon/registry/registry.h"
#include "daemon/registry/repointer.h"

namespace kreg {

struct ReplaceLimits {
  // `replace = "owner"`: replace=true by a module target's owner or root
  // makes its next generation. False: "deny".
  bool by_owner = false;
  // How long a replacement waits for the live holders to switch (section
  // 5; config key replace_timeout).
  absl::Duration timeout = absl::Seconds(10);
  // Live generations a target may have (section 2; config key
  // max_generations_per_target, 2 or more): the current one, the one it
  // replaced and every earlier one a live process holds or pins.
  uint32_t max_generations = 8;
};

// Replacements by outcome (kregd_replaces_total): every live holder switched
// (done), some did not within replace_timeout (timeout: the generation is
// committed all the same), or the replacement was refused.
struct ReplaceCounts {
  uint64_t done = 0;
  uint64_t timeout = 0;
  uint64_t refused = 0;
};

// How much longer than replace_timeout a replacement in cluster mode waits
// for the other hosts' acknowledgements (section 9): they start their
// re-point when their watch sees the generation, a moment after this
// host's.
constexpr absl::Duration kPeerAckGrace = absl::Seconds(3);

// DEADLINE_EXCEEDED's text for a replacement of `entry` whose `laggards`
// did not switch within `timeout` (section 5), and (cluster mode, §9)
// whose other `hosts` did not report or could not take it.
std::string LaggardsMessage(const TargetEntry& entry,
                            const std::vector<Repointer::Laggard>& laggards,
                            const std::vector<PeerAcks::Host>& hosts,
                            absl::Duration timeout);

// Thread-safe. Sets itself as `registry`'s change policy and adds itself to
// its install hooks; `registry` must outlive it.
class Replacement : public ChangePolicy, public InstallHook {
 public:
  Replacement(Registry* registry, ReplaceLimits limits);
  Replacement(const Replacement&) = delete;
  Replacement& operator=(const Replacement&) = delete;

  // Consulted once a generation is committed, while the name stays held
  // (two replacements never interleave). Null (the default): nothing is
  // re-pointed. Must outlive this.
  void SetRepointer(Repointer* repointer) { repointer_.store(repointer); }
  // Cluster mode: the other hosts' acknowledgements are awaited there.
  void SetBindingAuthority(BindingAuthority* authority) {
    authority_.store(authority);
  }

  // Re-points this host's holders of `entry` (a generation made elsewhere,
  // section 9) within replace_timeout: those that did not switch.
  std::vector<Repointer::Laggard> RepointHere(const TargetEntry& entry);

  const ReplaceLimits& limits() const { return limits_; }
  ReplaceCounts counts() const {
    return {done_.load(), timeout_.load(), refused_.load()};
  }

  // ChangePolicy: with limits.by_owner, replace=true with other content
  // makes the next generation: PERMISSION_DENIED naming the owner unless
  // `args.peer` is the owner or root, FAILED_PRECONDITION for an in-process
  // target, for a handler whose FFI API major or traits differ from the
  // current generation's; RESOURCE_EXHAUSTED naming the holders when the
  // target would have more than limits.max_generations live generations
  // (earlier generations no live process holds are dropped, checked before
  // the module is stored); the authority's errors in cluster mode. Once
  // committed, the repointer (if set) moves the live holders, and in
  // cluster mode every other host its own (BindingAuthority::AwaitPeerAcks,
  // outside the key's hold); DEADLINE_EXCEEDED naming those that did not
  // switch within the timeout (the generation stays committed).
  std::string RefusalHint(const TargetEntry& existing, TargetKind kind,
                          const RegisterArgs* request) const override;
  absl::Status Accept(const TargetEntry& existing, const RegisterArgs& args,
                      bool* take) const override;
  absl::StatusOr<RegisterOutcome> Change(const RegisterArgs& args,
                                         const std::string& digest,
                                         const std::string& cid,
                                         const EntryPtr& existing) override;
  absl::StatusOr<RegisterOutcome> Finish(RegisterOutcome out) override;

  // InstallHook: a generation's handler must be compatible with the one
  // before (FAILED_PRECONDITION naming both), and is recorded with it.
  absl::Status Probed(const TargetEntry& entry,
                      const HandlerInfo& info) override;
  absl::Status Committing(TargetEntry* entry,
                          const TargetEntry* previous) override;

 private:
  // The generations `existing`'s replacement keeps (the current one and
  // those the oracle's live processes hold), or RESOURCE_EXHAUSTED when
  // they and the new one are over limits.max_generations.
  absl::StatusOr<std::vector<Generation>> LiveGenerations(
      const TargetEntry& existing) const;

  Registry* const registry_;
  const ReplaceLimits limits_;
  std::atomic<Repointer*> repointer_{nullptr};
  std::atomic<BindingAuthority*> authority_{nullptr};
  std::atomic<uint64_t> done_{0};
  std::atomic<uint64_t> timeout_{0};
  // Counted by Accept (const), hence mutable.
  mutable std::atomic<uint64_t> refused_{0};
};

}  // namespace kreg

#endif  // KREGD_DAEMON_REGISTRY_REPLACEMENT_H_
