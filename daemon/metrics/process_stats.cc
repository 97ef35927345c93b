#include "daemon/metrics/process_stats.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "daemon/base/files.h"

namespace kreg {
namespace {

// Bounds a /proc file read.
constexpr size_t kMaxProcFile = 16 << 20;

// btime of /proc/stat: boot time in seconds since the epoch.
absl::StatusOr<double> BootTime() {
  KREG_ASSIGN_OR_RETURN(std::string text, ReadFile("/proc/stat", kMaxProcFile));
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::ConsumePrefix(&line, "btime ")) {
      uint64_t v = 0;
      if (absl::SimpleAtoi(line, &v)) return static_cast<double>(v);
    }
  }
  return absl::UnavailableError("/proc/stat has no btime line");
}

}  // namespace

absl::Status ParseProcStat(absl::string_view stat, double ticks_per_second,
                           uint64_t page_size, double boot_time_seconds,
                           ProcessStats* out) {
  size_t close = stat.rfind(')');
  if (close == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "/proc/self/stat \"", stat.substr(0, 200), "\" has no \"(comm)\""));
  }
  // Fields after "(comm)": field 3 (state) is index 0, so field N is N - 3.
  std::vector<absl::string_view> f =
      absl::StrSplit(stat.substr(close + 1), ' ', absl::SkipEmpty());
  auto field = [&](int n, uint64_t* v) {
    return n - 3 < static_cast<int>(f.size()) && absl::SimpleAtoi(f[n - 3], v);
  };
  uint64_t utime, stime, starttime, vsize, rss;
  if (!field(14, &utime) || !field(15, &stime) || !field(22, &starttime) ||
      !field(23, &vsize) || !field(24, &rss) || ticks_per_second <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("/proc/self/stat \"", stat.substr(0, 200),
                     "\" does not have the fields of proc(5)"));
  }
  out->cpu_seconds = static_cast<double>(utime + stime) / ticks_per_second;
  out->start_time_seconds =
      boot_time_seconds + static_cast<double>(starttime) / ticks_per_second;
  out->virtual_bytes = vsize;
  out->resident_bytes = rss * page_size;
  return absl::OkStatus();
}

absl::StatusOr<ProcessStats> ReadProcessStats() {
  ProcessStats s;
  KREG_ASSIGN_OR_RETURN(std::string stat,
                        ReadFile("/proc/self/stat", kMaxProcFile));
  KREG_ASSIGN_OR_RETURN(double boot, BootTime());
  long ticks = ::sysconf(_SC_CLK_TCK);
  long page = ::sysconf(_SC_PAGESIZE);
  KREG_RETURN_IF_ERROR(
      ParseProcStat(stat, static_cast<double>(ticks > 0 ? ticks : 100),
                    static_cast<uint64_t>(page > 0 ? page : 4096), boot, &s));
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (struct dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') ++s.open_fds;
    }
    ::closedir(d);
    if (s.open_fds > 0) --s.open_fds;  // the directory's own fd
  }
  struct rlimit rl;
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    s.max_fds = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : rl.rlim_cur;
  }
  return s;
}

void WriteProcessStats(const ProcessStats& s, PromWriter* w) {
  w->Family("process_cpu_seconds_total", "counter",
            "Total user and system CPU time spent in seconds.");
  w->Sample("process_cpu_seconds_total", {}, s.cpu_seconds);
  w->Family("process_open_fds", "gauge", "Number of open file descriptors.");
  w->Sample("process_open_fds", {}, s.open_fds);
  w->Family("process_max_fds", "gauge",
            "Maximum number of open file descriptors.");
  w->Sample("process_max_fds", {}, s.max_fds);
  w->Family("process_virtual_memory_bytes", "gauge",
            "Virtual memory size in bytes.");
  w->Sample("process_virtual_memory_bytes", {}, s.virtual_bytes);
  w->Family("process_resident_memory_bytes", "gauge",
            "Resident memory size in bytes.");
  w->Sample("process_resident_memory_bytes", {}, s.resident_bytes);
  w->Family("process_start_time_seconds", "gauge",
            "Start time of the process since unix epoch in seconds.");
  w->Sample("process_start_time_seconds", {}, s.start_time_seconds);
}

}  // namespace kreg
