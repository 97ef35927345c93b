#include "daemon/base/target_stats.h"

#include <algorithm>

namespace kreg {

const uint64_t kLatencyBoundNs[kLatencyBounds] = {
    500,          1000,         2000,        5000,        10000,
    20000,        50000,        100000,      200000,      500000,
    1000000,      2000000,      5000000,     10000000,    20000000,
    50000000,     100000000,    200000000,   500000000,   1000000000,
    2000000000,   5000000000,   10000000000, 20000000000, 50000000000,
    100000000000, 200000000000,
};

static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "stats rows live in shared memory");

void TargetStats::Add(const TargetStats& o) {
  launches = SaturatingAdd(launches, o.launches);
  errors = SaturatingAdd(errors, o.errors);
  sum_ns = SaturatingAdd(sum_ns, o.sum_ns);
  for (int i = 0; i < kLatencyBuckets; ++i) {
    buckets[i] = SaturatingAdd(buckets[i], o.buckets[i]);
  }
}

uint64_t TargetStats::count() const {
  uint64_t n = 0;
  for (uint64_t b : buckets) n = SaturatingAdd(n, b);
  return n;
}

double TargetStats::QuantileNs(double q) const {
  const uint64_t n = count();
  if (n == 0) return 0;
  q = std::min(1.0, std::max(q, 0.0));
  const double rank = q * static_cast<double>(n);
  double below = 0;
  for (int i = 0; i < kLatencyBuckets; ++i) {
    const double in = static_cast<double>(buckets[i]);
    if (in > 0 && below + in >= rank) {
      if (i == kLatencyBounds) {
        return static_cast<double>(kLatencyBoundNs[kLatencyBounds - 1]);
      }
      const double lo =
          i == 0 ? 0.0 : static_cast<double>(kLatencyBoundNs[i - 1]);
      const double hi = static_cast<double>(kLatencyBoundNs[i]);
      const double frac = std::min(1.0, std::max(0.0, (rank - below) / in));
      return lo + (hi - lo) * frac;
    }
    below += in;
  }
  return static_cast<double>(kLatencyBoundNs[kLatencyBounds - 1]);
}

TargetStats ReadUntrusted(const StatsRow& row) {
  TargetStats s;
  s.launches = row.launches.load(std::memory_order_relaxed);
  s.errors = std::min(row.errors.load(std::memory_order_relaxed), s.launches);
  s.sum_ns = row.sum_ns.load(std::memory_order_relaxed);
  for (int i = 0; i < kLatencyBuckets; ++i) {
    s.buckets[i] = row.buckets[i].load(std::memory_order_relaxed);
  }
  return s;
}

}  // namespace kreg
