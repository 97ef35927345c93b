// Per-target launch statistics (docs/operator-guide.md "Launch statistics"):
// counts, errors and a log-scale
// latency histogram. The executor updates a StatsRow in its status page
// lock-free on every handler call; kregd reads the rows (untrusted: a
// kernel shares the executor's address space), folds them into TargetStats
// values and derives percentiles.
#ifndef KREGD_DAEMON_BASE_TARGET_STATS_H_
#define KREGD_DAEMON_BASE_TARGET_STATS_H_

#include <array>
#include <atomic>
#include <cstdint>

namespace kreg {

// Upper bounds (ns) of the finite latency buckets: 1-2-5 steps from 0.5 us
// to 100 s. A last bucket takes everything slower (+Inf).
constexpr int kLatencyBounds = 27;
constexpr int kLatencyBuckets = kLatencyBounds + 1;
extern const uint64_t kLatencyBoundNs[kLatencyBounds];

// The bucket of a latency: the first whose bound is >= `ns`.
inline int LatencyBucket(uint64_t ns) {
  int lo = 0;
  int hi = kLatencyBounds;  // the overflow bucket
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (ns <= kLatencyBoundNs[mid]) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// One target's counters in shared memory. Any number of threads update it
// with relaxed atomic adds; readers see each word as of some moment.
struct StatsRow {
  std::atomic<uint64_t> launches;
  std::atomic<uint64_t> errors;
  std::atomic<uint64_t> sum_ns;
  std::atomic<uint64_t> buckets[kLatencyBuckets];
};

// Records one handler call that took `ns` (the executor's hot path).
inline void RecordLaunch(StatsRow* row, uint64_t ns, bool ok) {
  row->launches.fetch_add(1, std::memory_order_relaxed);
  if (!ok) row->errors.fetch_add(1, std::memory_order_relaxed);
  row->sum_ns.fetch_add(ns, std::memory_order_relaxed);
  row->buckets[LatencyBucket(ns)].fetch_add(1, std::memory_order_relaxed);
}

// a + b, saturating at UINT64_MAX (counts from an untrusted page must not
// wrap a sum).
inline uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  return a + b < a ? UINT64_MAX : a + b;
}

// A snapshot of one target's statistics, summed over executors. A plain
// value; not thread-safe.
struct TargetStats {
  uint64_t launches = 0;
  uint64_t errors = 0;
  uint64_t sum_ns = 0;
  std::array<uint64_t, kLatencyBuckets> buckets{};

  // Adds `o` (saturating).
  void Add(const TargetStats& o);
  // Calls in the histogram (saturating sum of the buckets).
  uint64_t count() const;
  // The latency (ns) below which a fraction `q` (0 < q <= 1) of the calls
  // fall, interpolated linearly inside its bucket (as Prometheus'
  // histogram_quantile does); the largest finite bound when it falls in the
  // overflow bucket; 0 with no calls. Monotone in q.
  double QuantileNs(double q) const;
};

// Reads a row kregd does not trust: each word once; errors are clamped to
// launches. Never fails (any bytes are some counts).
TargetStats ReadUntrusted(const StatsRow& row);

}  // namespace kreg

#endif  // KREGD_DAEMON_BASE_TARGET_STATS_H_
