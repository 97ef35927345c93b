// The Registry core's refusals, worded (DESIGN §2): the identity rules of
// a registration (what "the same registration" means, and the refusals
// when it is not, each naming both identities and the remedy) and the
// per-uid quotas.
#ifndef KREGD_DAEMON_REGISTRY_REFUSALS_H_
#define KREGD_DAEMON_REGISTRY_REFUSALS_H_

#include <string>

#include "absl/status/statusor.h"
#include "daemon/base/types.h"
#include "daemon/registry/register_args.h"

namespace kreg {

// Who holds a binding and since when, for refusals: "uid 1000 (alice)
// since 2025-01-02T03:04:05Z". The user name is left out when the uid has
// no passwd entry here (an NSS lookup: never under the registry's lock);
// the time when the entry has none.
std::string Holder(const TargetEntry& e);

// FAILED_PRECONDITION: `existing`'s key is registered with other content
// than `kind` content `cid`, function `func_name` (the caller appends its
// hints to the message).
absl::Status OtherContent(const TargetEntry& existing, TargetKind kind,
                          const std::string& cid, const std::string& func_name);

// A content_id of the form "sha256:..." claims to be the module's digest:
// it must be. INVALID_ARGUMENT quoting both otherwise.
absl::Status CheckClaimedDigest(const std::string& content_id,
                                const std::string& digest);

// For an identity equal by content_id: the same uid may rebuild (the
// build-cache case); another uid must bring the same module bytes, or it
// would be handed the owner's code under its own content_id claim.
absl::Status CheckOwnerOrDigest(const TargetEntry& existing,
                                const PeerCred& peer,
                                const std::string& digest);

// `refusal` of the same bytes and function under another content_id: the
// build cache key changed, not the kernel.
absl::Status OnlyContentIdDiffers(const absl::Status& refusal,
                                  const std::string& digest);

// RESOURCE_EXHAUSTED: registering `key` would take `uid`, which has
// `registrations`, past `limit` (max_registrations_per_uid).
absl::Status TooManyRegistrations(const TargetKey& key, uid_t uid,
                                  uint64_t registrations, uint64_t limit);
// RESOURCE_EXHAUSTED: `more` bytes would take `uid`'s store use of `bytes`
// past `limit` (max_store_bytes_per_uid).
absl::Status TooManyBytes(const TargetKey& key, uid_t uid, uint64_t bytes,
                          uint64_t more, uint64_t limit);

// One info line per decision: who, what, the outcome and why.
void LogDecision(const RegisterArgs& args, const std::string& digest,
                 const absl::StatusOr<RegisterOutcome>& out);

}  // namespace kreg

#endif  // KREGD_DAEMON_REGISTRY_REFUSALS_H_
