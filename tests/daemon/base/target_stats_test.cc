#include "daemon/base/target_stats.h"

#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <utility>

#include "catch2/catch.hpp"
#include "daemon/base/status_page.h"
#include "daemon/registry/target_proto.h"

namespace kreg {
namespace {

TargetStats Recorded(std::initializer_list<std::pair<uint64_t, bool>> calls) {
  StatsRow row{};
  for (const auto& [ns, ok] : calls) RecordLaunch(&row, ns, ok);
  return ReadUntrusted(row);
}

TEST_CASE("Latency buckets are the 1-2-5 bounds, inclusive", "[stats]") {
  CHECK(LatencyBucket(0) == 0);
  CHECK(LatencyBucket(500) == 0);
  CHECK(LatencyBucket(501) == 1);
  CHECK(LatencyBucket(1000) == 1);
  CHECK(LatencyBucket(1001) == 2);
  CHECK(LatencyBucket(3000) == 3);
  CHECK(LatencyBucket(kLatencyBoundNs[kLatencyBounds - 1]) ==
        kLatencyBounds - 1);
  CHECK(LatencyBucket(kLatencyBoundNs[kLatencyBounds - 1] + 1) ==
        kLatencyBounds);
  CHECK(LatencyBucket(UINT64_MAX) == kLatencyBounds);
  for (int i = 1; i < kLatencyBounds; ++i) {
    CHECK(kLatencyBoundNs[i] > kLatencyBoundNs[i - 1]);
  }
}

TEST_CASE("Recorded calls count launches, errors, sum and buckets", "[stats]") {
  TargetStats s = Recorded({{3000, true}, {4000, false}, {40000, true}});
  CHECK(s.launches == 3);
  CHECK(s.errors == 1);
  CHECK(s.sum_ns == 47000);
  CHECK(s.count() == 3);
  CHECK(s.buckets[3] == 2);  // (2 us, 5 us]
  CHECK(s.buckets[6] == 1);  // (20 us, 50 us]
}

TEST_CASE("Quantiles interpolate inside the bucket and stay ordered",
          "[stats]") {
  TargetStats none;
  CHECK(none.QuantileNs(0.5) == 0);

  TargetStats s;
  s.buckets[3] = 100;  // all in (2 us, 5 us]
  CHECK(s.QuantileNs(0.5) == Approx(3500));
  CHECK(s.QuantileNs(1.0) == Approx(5000));

  s.buckets[6] = 100;  // and as many in (20 us, 50 us]
  double p50 = s.QuantileNs(0.5);
  double p90 = s.QuantileNs(0.9);
  double p99 = s.QuantileNs(0.99);
  CHECK(p50 == Approx(5000));
  CHECK(p90 == Approx(20000 + 30000 * 0.8));
  CHECK(p50 <= p90);
  CHECK(p90 <= p99);
  CHECK(p99 <= 50000);

  TargetStats slow;
  slow.buckets[kLatencyBounds] = 7;  // beyond 200 s
  CHECK(slow.QuantileNs(0.5) ==
        static_cast<double>(kLatencyBoundNs[kLatencyBounds - 1]));
}

TEST_CASE("Sums saturate instead of wrapping", "[stats]") {
  TargetStats a;
  a.launches = UINT64_MAX - 1;
  a.buckets[0] = UINT64_MAX;
  TargetStats b;
  b.launches = 5;
  b.buckets[1] = 5;
  a.Add(b);
  CHECK(a.launches == UINT64_MAX);
  CHECK(a.count() == UINT64_MAX);
  CHECK(SaturatingAdd(UINT64_MAX, UINT64_MAX) == UINT64_MAX);
  CHECK(SaturatingAdd(1, 2) == 3);
}

TEST_CASE("A row of garbage reads as clamped, ordered statistics",
          "[stats][hostile]") {
  StatsRow row;
  memset(static_cast<void*>(&row), 0xff, sizeof(row));
  TargetStats s = ReadUntrusted(row);
  CHECK(s.errors <= s.launches);
  CHECK(s.count() == UINT64_MAX);
  v1::TargetStats p = StatsToProto({"t", Platform::kCpu}, s);
  CHECK(p.latency().p50_us() <= p.latency().p90_us());
  CHECK(p.latency().p90_us() <= p.latency().p99_us());

  // More errors than launches: errors are clamped.
  StatsRow lying{};
  lying.launches.store(2);
  lying.errors.store(9);
  CHECK(ReadUntrusted(lying).errors == 2);
}

TEST_CASE("StatsToProto reports microseconds and the histogram count",
          "[stats]") {
  TargetStats s = Recorded({{3000, true}, {3000, true}, {3000, false}});
  v1::TargetStats p = StatsToProto({"demo.scale", Platform::kCuda}, s);
  CHECK(p.target_name() == "demo.scale");
  CHECK(p.platform() == "cuda");
  CHECK(p.launches() == 3);
  CHECK(p.errors() == 1);
  CHECK(p.latency().count() == 3);
  CHECK(p.latency().sum_us() == Approx(9));
  CHECK(p.latency().p50_us() > 2);
  CHECK(p.latency().p99_us() <= 5);
}

TEST_CASE("The status page's stats rows are shared and bounded by token",
          "[stats][status_page]") {
  absl::StatusOr<StatusPage> kregd = StatusPage::Create(4);
  REQUIRE(kregd.ok());
  CHECK(kregd->stats_row(0) == nullptr);
  CHECK(kregd->stats_row(kStatsRows + 1) == nullptr);
  REQUIRE(kregd->stats_row(1) != nullptr);
  REQUIRE(kregd->stats_row(kStatsRows) != nullptr);
  CHECK(kregd->stats_row(2) == kregd->stats_row(1) + 1);
  // The last row ends inside the mapping, after the last slot.
  CHECK(reinterpret_cast<const char*>(kregd->stats_row(1)) >=
        reinterpret_cast<const char*>(kregd->slot(3) + 1));

  // The executor maps the same memfd and writes; kregd reads.
  UniqueFd dup(::dup(kregd->fd()));
  absl::StatusOr<StatusPage> exec = StatusPage::Map(std::move(dup), 4);
  REQUIRE(exec.ok());
  RecordLaunch(exec->stats_row(7), 1500, false);
  exec->slot(2)->launches.fetch_add(1);
  TargetStats s = ReadUntrusted(*kregd->stats_row(7));
  CHECK(s.launches == 1);
  CHECK(s.errors == 1);
  CHECK(s.buckets[2] == 1);
  CHECK(kregd->slot(2)->launches.load() == 1);
  CHECK(ReadUntrusted(*kregd->stats_row(6)).launches == 0);
}

TEST_CASE("An executor refuses a page of another layout version",
          "[stats][status_page]") {
  absl::StatusOr<StatusPage> kregd = StatusPage::Create(2);
  REQUIRE(kregd.ok());
  kregd->header()->magic = 0x6b726567;  // the layout before the stats table
  absl::StatusOr<StatusPage> exec =
      StatusPage::Map(UniqueFd(::dup(kregd->fd())), 2);
  CHECK(exec.status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("Nobody holding the page's fd can resize it under kregd",
          "[status_page]") {
  absl::StatusOr<StatusPage> kregd = StatusPage::Create(2);
  REQUIRE(kregd.ok());
  // What a kernel in the executor could do to fd 4: kregd would take SIGBUS
  // reading a shrunk page.
  CHECK(::ftruncate(kregd->fd(), 0) != 0);
  CHECK(::ftruncate(kregd->fd(), 1 << 30) != 0);
  CHECK(::fcntl(kregd->fd(), F_ADD_SEALS, F_SEAL_WRITE) != 0);  // sealed seals
  absl::StatusOr<StatusPage> again =
      StatusPage::Map(UniqueFd(::dup(kregd->fd())), 2, /*require_seals=*/true);
  CHECK(again.ok());
}

TEST_CASE("kregd refuses an offered page that could be resized",
          "[status_page]") {
  // A page-sized memfd with the right header but no seals, as a forged
  // executor could offer it.
  absl::StatusOr<StatusPage> model = StatusPage::Create(2);
  REQUIRE(model.ok());
  struct stat st;
  REQUIRE(::fstat(model->fd(), &st) == 0);
  UniqueFd fd(::memfd_create("forged", MFD_CLOEXEC));
  REQUIRE(::ftruncate(fd.get(), st.st_size) == 0);
  std::string bytes(st.st_size, '\0');
  REQUIRE(::pread(model->fd(), bytes.data(), bytes.size(), 0) ==
          static_cast<ssize_t>(bytes.size()));
  REQUIRE(::pwrite(fd.get(), bytes.data(), bytes.size(), 0) ==
          static_cast<ssize_t>(bytes.size()));
  absl::StatusOr<StatusPage> page =
      StatusPage::Map(std::move(fd), 2, /*require_seals=*/true);
  REQUIRE(page.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(page.status().message()).find("sealed against resizing") !=
        std::string::npos);
}

}  // namespace
}  // namespace kreg
