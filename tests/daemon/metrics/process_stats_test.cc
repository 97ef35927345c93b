#include "daemon/metrics/process_stats.h"

#include <string>

#include "catch2/catch.hpp"

namespace kreg {
namespace {

// A /proc/PID/stat line (proc(5)) whose command name holds a space and a
// ')': utime 250, stime 50, starttime 1000, vsize 8192000, rss 300 pages.
constexpr char kStat[] =
    "4242 (kreg d) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 "
    "3 0 1000 8192000 300 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 "
    "17 1 0 0 0 0 0";

TEST_CASE("ParseProcStat reads the standard process fields") {
  ProcessStats s;
  REQUIRE(ParseProcStat(kStat, 100, 4096, 1700000000, &s).ok());
  CHECK(s.cpu_seconds == 3.0);
  CHECK(s.start_time_seconds == 1700000010.0);
  CHECK(s.virtual_bytes == 8192000);
  CHECK(s.resident_bytes == 300 * 4096);
}

TEST_CASE("ParseProcStat refuses a line that is not proc(5)'s, quoting it") {
  ProcessStats s;
  absl::Status st = ParseProcStat("garbage", 100, 4096, 0, &s);
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(st.message()) ==
        "/proc/self/stat \"garbage\" has no \"(comm)\"");
  st = ParseProcStat("1 (x) S 1 2", 100, 4096, 0, &s);
  CHECK(std::string(st.message()) ==
        "/proc/self/stat \"1 (x) S 1 2\" does not have the fields of proc(5)");
}

TEST_CASE("ReadProcessStats describes this process") {
  absl::StatusOr<ProcessStats> s = ReadProcessStats();
  REQUIRE(s.ok());
  CHECK(s->resident_bytes > 0);
  CHECK(s->virtual_bytes >= s->resident_bytes);
  CHECK(s->open_fds >= 3);
  CHECK(s->max_fds >= s->open_fds);
  CHECK(s->start_time_seconds > 1.5e9);
}

}  // namespace
}  // namespace kreg
