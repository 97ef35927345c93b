// One statistics row per generation of a registration (docs/replace.md
// section 8): what an executor's launches are counted under, and what the
// status page and metrics read.
#ifndef KREGD_DAEMON_SUPERVISOR_GENERATION_STATS_H_
#define KREGD_DAEMON_SUPERVISOR_GENERATION_STATS_H_

#include <cstdint>
#include <tuple>

#include "daemon/base/target_stats.h"
#include "daemon/base/types.h"

namespace kreg {

// Which generation of which registration an entry is (docs/replace.md
// section 8). An executor gets one token, one statistics row, per
// generation: a pinned resolve counts in its generation's row, a
// replacement's generation in a row of its own. A name retired and
// registered again is another registration (registered_at_us; a
// replacement keeps it).
struct GenerationId {
  TargetKey key;
  int64_t registered_at_us = 0;
  uint32_t generation = 0;
  explicit GenerationId(const TargetEntry& e)
      : key(e.key),
        registered_at_us(e.registered_at_us),
        generation(e.generation) {}
  bool operator<(const GenerationId& o) const {
    return std::tie(key, registered_at_us, generation) <
           std::tie(o.key, o.registered_at_us, o.generation);
  }
  bool operator==(const GenerationId& o) const {
    return key == o.key && registered_at_us == o.registered_at_us &&
           generation == o.generation;
  }
};

// One generation's statistics, summed over live and reaped executors;
// `entry` is an entry of that generation.
struct TargetStatsRow {
  EntryPtr entry;
  TargetStats stats;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_SUPERVISOR_GENERATION_STATS_H_
