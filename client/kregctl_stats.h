// kregctl's views of launch statistics (status, show) and of the live
// sessions (sessions): JSON objects and text tables.
#ifndef KREGD_CLIENT_KREGCTL_STATS_H_
#define KREGD_CLIENT_KREGCTL_STATS_H_

#include <string>

#include "google/protobuf/repeated_field.h"
#include "kreg/v1/registry.pb.h"
#include "nlohmann/json.hpp"

namespace kreg {

// {"launches", "errors", "latency_us": {"count", "p50", "p90", "p99"}}
nlohmann::json StatsJson(const v1::TargetStats& s);
// One line: "launches 10, errors 1, latency p50 3.2 us, p90 ..., p99 ...".
std::string StatsLine(const v1::TargetStats& s);
// A table of targets with calls (nothing when there are none).
void PrintStatsTable(
    const google::protobuf::RepeatedPtrField<v1::TargetStats>& stats);

nlohmann::json SessionJson(const v1::SessionInfo& s);
void PrintSessionsTable(const v1::ListSessionsResponse& sessions);

}  // namespace kreg

#endif  // KREGD_CLIENT_KREGCTL_STATS_H_
