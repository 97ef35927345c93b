// The process_* metrics every Prometheus client library exports, with their
// standard names and meanings (operator guide, "Metrics"): read from
// /proc/self, for the kregd process itself (not its executors).
#ifndef KREGD_DAEMON_METRICS_PROCESS_STATS_H_
#define KREGD_DAEMON_METRICS_PROCESS_STATS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/metrics/prometheus_text.h"

namespace kreg {

struct ProcessStats {
  double start_time_seconds = 0;  // since the Unix epoch
  double cpu_seconds = 0;         // user + system
  uint64_t resident_bytes = 0;
  uint64_t virtual_bytes = 0;
  uint64_t open_fds = 0;
  uint64_t max_fds = 0;  // the soft RLIMIT_NOFILE
};

// The fields of a /proc/PID/stat line that ProcessStats needs, with the
// system's clock tick, page size and boot time (btime of /proc/stat, in
// seconds since the epoch). INVALID_ARGUMENT quoting the line when it does
// not parse (the command name may hold spaces and parentheses: the fields
// start after the last ')').
absl::Status ParseProcStat(absl::string_view stat, double ticks_per_second,
                           uint64_t page_size, double boot_time_seconds,
                           ProcessStats* out);

// This process's statistics; the error says which /proc file failed.
absl::StatusOr<ProcessStats> ReadProcessStats();

// Appends the six process_* families to `w`.
void WriteProcessStats(const ProcessStats& s, PromWriter* w);

}  // namespace kreg

#endif  // KREGD_DAEMON_METRICS_PROCESS_STATS_H_
