#include <cstdio>

#include "client/kregctl/common.h"

namespace kreg {
namespace {

using json = nlohmann::ordered_json;

std::string Us(double us) {
  char buf[32];
  if (us >= 1e6) {
    std::snprintf(buf, sizeof(buf), "%.2f s", us / 1e6);
  } else if (us >= 1e3) {
    std::snprintf(buf, sizeof(buf), "%.2f ms", us / 1e3);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f us", us);
  }
  return buf;
}

std::string TargetText(const v1::TargetRef& t) {
  // Isolated is the default; only local holds are marked, and the
  // generation once a target was replaced (docs/replace.md).
  return t.target_name() + "(" + t.platform() +
         (t.mode() == "local" ? ",local" : "") +
         (t.generation() > 1 ? ",gen " + std::to_string(t.generation()) : "") +
         ")";
}

}  // namespace

json StatsJson(const v1::TargetStats& s) {
  return json{{"launches", s.launches()},
              {"errors", s.errors()},
              {"latency_us", json{{"count", s.latency().count()},
                                  {"p50", s.latency().p50_us()},
                                  {"p90", s.latency().p90_us()},
                                  {"p99", s.latency().p99_us()},
                                  {"sum", s.latency().sum_us()}}}};
}

std::string StatsLine(const v1::TargetStats& s) {
  std::string out = "launches " + std::to_string(s.launches()) + ", errors " +
                    std::to_string(s.errors());
  if (s.latency().count() > 0) {
    out += ", latency p50 " + Us(s.latency().p50_us()) + ", p90 " +
           Us(s.latency().p90_us()) + ", p99 " + Us(s.latency().p99_us());
  }
  return out;
}

void PrintStatsTable(
    const google::protobuf::RepeatedPtrField<v1::TargetStats>& stats) {
  if (stats.empty()) return;
  std::printf("\n%-32s %-5s %10s %8s %10s %10s %10s\n", "TARGET", "PLAT",
              "LAUNCHES", "ERRORS", "P50", "P90", "P99");
  for (const v1::TargetStats& s : stats) {
    std::printf(
        "%-32s %-5s %10llu %8llu %10s %10s %10s\n", s.target_name().c_str(),
        s.platform().c_str(), static_cast<unsigned long long>(s.launches()),
        static_cast<unsigned long long>(s.errors()),
        Us(s.latency().p50_us()).c_str(), Us(s.latency().p90_us()).c_str(),
        Us(s.latency().p99_us()).c_str());
  }
}

json SessionJson(const v1::SessionInfo& s) {
  json targets = json::array();
  for (const v1::TargetRef& t : s.targets()) {
    targets.push_back(json{{"target_name", t.target_name()},
                           {"platform", t.platform()},
                           {"mode", t.mode().empty() ? "isolated" : t.mode()},
                           {"generation", t.generation()}});
  }
  return json{{"session_id", s.session_id()},
              {"pid", s.pid()},
              {"uid", s.uid()},
              {"gid", s.gid()},
              {"targets", targets},
              {"launches", s.launches()},
              {"since", UtcTime(s.since_us())},
              {"since_us", s.since_us()},
              {"executor_pid", s.executor_pid()},
              {"executor", s.executor()},
              {"arena_bytes", s.arena_bytes()},
              {"states", s.states()}};
}

void PrintSessionsTable(const v1::ListSessionsResponse& sessions) {
  std::printf("%-8s %-8s %-6s %10s %-20s %-9s %s\n", "PID", "UID", "ID",
              "LAUNCHES", "SINCE", "EXECUTOR", "TARGETS");
  for (const v1::SessionInfo& s : sessions.sessions()) {
    std::string targets;
    for (const v1::TargetRef& t : s.targets()) {
      if (!targets.empty()) targets += ",";
      targets += TargetText(t);
    }
    std::printf("%-8d %-8u %-6llu %10llu %-20s %-9d %s\n", s.pid(), s.uid(),
                static_cast<unsigned long long>(s.session_id()),
                static_cast<unsigned long long>(s.launches()),
                UtcTime(s.since_us()).c_str(), s.executor_pid(),
                targets.empty() ? "-" : targets.c_str());
  }
}

}  // namespace kreg
