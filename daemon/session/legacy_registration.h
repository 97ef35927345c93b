// Session protocol 1.0-1.6's registration messages (session.proto's
// RegisterRequest, TargetInfo, RegisterReply, ListReply), mapped at the
// executor's edge onto registration.proto's, which everything behind it
// speaks: a client library older than its kregd keeps registering, listing
// and binding (DESIGN §12, upgrades fail no call).
#ifndef KREGD_DAEMON_SESSION_LEGACY_REGISTRATION_H_
#define KREGD_DAEMON_SESSION_LEGACY_REGISTRATION_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "kreg/v1/session.pb.h"

namespace kreg {

// The RegisterTargetHeader a 1.0-1.6 client's `request` says. Its fds are
// `*fds`, which the header's rules then check (an upload has exactly one).
// An inline upload (1.0-1.2) becomes an upload whose fd, a sealed memfd of
// its bytes, is appended to `*fds`; INVALID_ARGUMENT when it is empty,
// exceeds `max_module_bytes` (SealedModuleMemfd's messages) or comes with
// fds of its own.
absl::StatusOr<v1::RegisterTargetHeader> FromLegacyRegister(
    const v1::RegisterRequest& request, std::vector<UniqueFd>* fds,
    uint64_t max_module_bytes);

// `target` as a 1.0-1.6 client reads it (Audit flattened; no host, no
// stats).
v1::TargetInfo ToTargetInfo(const v1::Target& target);
v1::RegisterReply ToLegacyReply(const v1::RegisterTargetResponse& response);
v1::ListReply ToLegacyList(const v1::ListTargetsResponse& response);

}  // namespace kreg

#endif  // KREGD_DAEMON_SESSION_LEGACY_REGISTRATION_H_
