// kregctl status, config, health, sessions and gc: the daemon itself.
#include <iostream>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "client/kregctl/common.h"

namespace kreg {
namespace {

using json = nlohmann::ordered_json;

json StatusJson(const v1::GetStatusResponse& s) {
  json j{{"version", s.version()},
         {"uptime_s", s.uptime_s()},
         {"targets", s.targets()},
         {"modules_loaded", s.modules_loaded()},
         {"sessions", s.sessions()},
         {"launches", s.launches()},
         {"launch_errors", s.launch_errors()},
         {"registrations_refused", s.registrations_refused()},
         {"state_dir", s.state_dir()},
         {"socket", s.socket_path()},
         {"ffi_api", std::to_string(s.ffi_api_major()) + "." +
                         std::to_string(s.ffi_api_minor())},
         {"isolation", s.isolation()},
         {"executors_started", s.executors_started()},
         {"executor_crashes", s.executor_crashes()},
         {"quarantined", s.quarantined()},
         {"seccomp", s.seccomp()},
         {"max_module_bytes", s.max_module_bytes()},
         {"compile_requests", s.compile_requests()},
         {"compiles", s.compiles()},
         {"compile_cache_hits", s.compile_cache_hits()},
         {"compile_waits", s.compile_waits()},
         {"compile_failures", s.compile_failures()},
         {"compile_cache_bytes", s.compile_cache_bytes()},
         {"compile_cache_entries", s.compile_cache_entries()},
         {"compile_peer_fetches", s.compile_peer_fetches()}};
  // An older kregd does not report GPU sharing.
  if (!s.gpu_sharing().empty()) {
    j["gpu_sharing"] = s.gpu_sharing();
    j["gpu_sharing_note"] = s.gpu_sharing_note();
  }
  if (!s.executor_note().empty()) j["executor_note"] = s.executor_note();
  return j;
}

json ExecutorsJson(const v1::GetStatusResponse& s) {
  json execs = json::array();
  for (const auto& e : s.executors()) {
    execs.push_back(json{{"pid", e.pid()},
                         {"group", e.group()},
                         {"uid", e.uid()},
                         {"gid", e.gid()},
                         {"sessions", e.sessions()},
                         {"launches", e.launches()}});
  }
  return execs;
}

int RunStatus(Connection& kregd, bool as_json) {
  auto s = kregd.client->Status();
  if (!s.ok()) return Fail(s.status());
  json j = StatusJson(*s);
  json execs = ExecutorsJson(*s);
  if (as_json) {
    j["executors"] = execs;
    json stats = json::array();
    for (const auto& t : s->target_stats()) {
      json row = StatsJson(t);
      row["target_name"] = t.target_name();
      row["platform"] = t.platform();
      stats.push_back(row);
    }
    j["target_stats"] = stats;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  PrintFields(j);
  for (const json& e : execs) {
    std::cout << "executor pid " << e["pid"] << " ("
              << e["group"].get<std::string>() << ", uid " << e["uid"]
              << "): " << e["sessions"] << " sessions, " << e["launches"]
              << " launches\n";
  }
  PrintStatsTable(s->target_stats());
  return 0;
}

int RunConfig(Connection& kregd, bool as_json) {
  auto cfg = kregd.client->Config();
  if (!cfg.ok() && cfg.status().code() == absl::StatusCode::kUnimplemented) {
    // A kregd older than kregctl config has no GetConfig.
    std::cerr << "kregd at " << kregd.socket
              << " does not report its configuration: it predates "
                 "`kregctl config` (`kregctl status` shows its version); "
                 "upgrade kregd, or read its --config file and flags\n";
    return 1;
  }
  if (!cfg.ok()) return Fail(cfg.status());
  if (!as_json) {
    std::cout << cfg->toml();
    return 0;
  }
  json values = json::object();
  for (const auto& v : cfg->values()) {
    // value_toml is also valid JSON (GetConfigResponse).
    values[v.key()] = json{{"value", json::parse(v.value_toml(), nullptr,
                                                 /*allow_exceptions=*/false)},
                           {"origin", v.origin()}};
  }
  json j{{"config_file", cfg->config_file()}, {"values", values}};
  std::cout << j.dump(2) << "\n";
  return 0;
}

int RunHealth(Connection& kregd) {
  absl::Status s = kregd.client->Health();
  if (!s.ok()) return Fail(s);
  std::cout << "SERVING\n";
  return 0;
}

int RunSessions(Connection& kregd, bool as_json) {
  auto list = kregd.client->Sessions();
  if (!list.ok()) return Fail(list.status());
  if (as_json) {
    json j = json::array();
    for (const auto& s : list->sessions()) j.push_back(SessionJson(s));
    std::cout << j.dump(2) << "\n";
  } else {
    PrintSessionsTable(*list);
  }
  return 0;
}

int RunGc(Connection& kregd) {
  auto out = kregd.client->CollectGarbage();
  if (!out.ok()) return Fail(out.status());
  std::cout << "removed " << out->files_removed() << " files ("
            << out->bytes_removed() << " bytes); kept " << out->files_kept()
            << " files (" << out->bytes_kept() << " bytes)\n"
            << "compile cache: removed " << out->compile_files_removed()
            << " files (" << out->compile_bytes_removed() << " bytes); kept "
            << out->compile_files_kept() << " files ("
            << out->compile_bytes_kept() << " bytes)\n";
  return 0;
}

}  // namespace

Command AddStatusCommand(CLI::App& app) {
  auto as_json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("status", "daemon status");
  cmd->add_flag("--json", *as_json, "print JSON");
  return {cmd,
          [as_json](Connection& kregd) { return RunStatus(kregd, *as_json); }};
}

Command AddConfigCommand(CLI::App& app) {
  auto as_json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand(
      "config",
      "kregd's effective configuration as TOML, each value followed by "
      "where it came from (default, config file, --flag)");
  cmd->add_flag("--json", *as_json, "print JSON");
  return {cmd,
          [as_json](Connection& kregd) { return RunConfig(kregd, *as_json); }};
}

Command AddHealthCommand(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("health", "health check");
  return {cmd, RunHealth};
}

Command AddSessionsCommand(CLI::App& app) {
  auto as_json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand(
      "sessions", "list the live client sessions (pid, uid, targets)");
  cmd->add_flag("--json", *as_json, "print JSON");
  return {cmd, [as_json](Connection& kregd) {
            return RunSessions(kregd, *as_json);
          }};
}

Command AddGcCommand(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "gc", "remove module store files no registration references");
  return {cmd, RunGc};
}

}  // namespace kreg
