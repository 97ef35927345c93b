// Conversions between TargetEntry and its kreg.v1.Target message.
#ifndef KREGD_DAEMON_REGISTRY_TARGET_PROTO_H_
#define KREGD_DAEMON_REGISTRY_TARGET_PROTO_H_

#include "absl/status/statusor.h"
#include "daemon/base/target_stats.h"
#include "daemon/base/types.h"
#include "kreg/v1/registry.pb.h"

namespace kreg {

v1::Target ToProto(const TargetEntry& entry);

// `stats` of `key` as a message: counts and p50/p90/p99 in microseconds
// (kept ordered even for counts an executor made up).
v1::TargetStats StatsToProto(const TargetKey& key, const TargetStats& stats);

// INVALID_ARGUMENT if the message's name or platform are not valid.
absl::StatusOr<TargetEntry> FromProto(const v1::Target& target);

}  // namespace kreg

#endif  // KREGD_DAEMON_REGISTRY_TARGET_PROTO_H_
