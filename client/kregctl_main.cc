// kregctl: admin CLI of kregd. Exit codes (docs/errors.md, "Exit status of
// kregctl", the list the man page is made from): 0 success (including an
// idempotent no-op), 1 other errors, 2 usage or invalid argument (also a
// cluster-only command on a kregd not in cluster mode: UNIMPLEMENTED),
// 3 registration refused, 4 daemon unreachable. The daemon's message goes to
// stderr unchanged.
#include <sys/stat.h>
#include <unistd.h>

#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "CLI/CLI.hpp"
#include "client/client.h"
#include "client/kregctl_cluster.h"
#include "client/kregctl_compile.h"
#include "client/kregctl_stats.h"
#include "common/paths.h"
#include "common/version.h"
#include "nlohmann/json.hpp"

namespace {

using kreg::v1::Target;
using nlohmann::json;

int ExitCode(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return 0;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kUnimplemented:
      return 2;
    case absl::StatusCode::kFailedPrecondition:
      return 3;
    case absl::StatusCode::kUnavailable:
      return 4;
    default:
      return 1;
  }
}

int Fail(const absl::Status& s) {
  std::cerr << s.message() << "\n";
  return ExitCode(s);
}

std::string Time(int64_t us) {
  std::time_t t = static_cast<std::time_t>(us / 1000000);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

json ToJson(const Target& t) {
  return json{{"target_name", t.target_name()},
              {"platform", t.platform()},
              {"func_name", t.func_name()},
              {"content_id", t.content_id()},
              {"module_digest", t.module_digest()},
              {"module_size", t.module_size()},
              {"kind", t.kind()},
              {"ffi_api", std::to_string(t.ffi_api_major()) + "." +
                              std::to_string(t.ffi_api_minor())},
              {"traits", t.traits()},
              {"uid", t.audit().uid()},
              {"gid", t.audit().gid()},
              {"pid", t.audit().pid()},
              {"registered_at", Time(t.audit().registered_at_us())},
              {"origin", t.audit().origin()},
              {"host", t.audit().host()},
              {"runnable", t.not_runnable().empty()},
              {"not_runnable", t.not_runnable()}};
}

// Targets this kregd cannot run are marked "no" under RUN, with the reason
// after the table.
void PrintTable(const std::vector<Target>& targets) {
  std::printf("%-32s %-5s %-4s %-20s %-22s %-7s %-6s %-8s %-20s %s\n", "NAME",
              "PLAT", "RUN", "FUNCTION", "CONTENT", "KIND", "UID", "PID",
              "REGISTERED", "ORIGIN");
  std::vector<const Target*> not_runnable;
  for (const Target& t : targets) {
    std::string content = t.content_id().substr(0, 22);
    bool runnable = t.not_runnable().empty();
    if (!runnable) not_runnable.push_back(&t);
    std::printf("%-32s %-5s %-4s %-20s %-22s %-7s %-6u %-8d %-20s %s\n",
                t.target_name().c_str(), t.platform().c_str(),
                runnable ? "yes" : "no", t.func_name().c_str(), content.c_str(),
                t.kind().c_str(), t.audit().uid(), t.audit().pid(),
                Time(t.audit().registered_at_us()).c_str(),
                t.audit().origin().c_str());
  }
  for (const Target* t : not_runnable) {
    std::printf("not runnable here: %s (%s): %s\n", t->target_name().c_str(),
                t->platform().c_str(), t->not_runnable().c_str());
  }
}

// The subcommand names of `app`, comma-separated.
std::string CommandList(CLI::App& app) {
  std::string out;
  for (const CLI::App* sub : app.get_subcommands({})) {
    if (!out.empty()) out += ", ";
    out += sub->get_name();
  }
  return out;
}

// "unknown command foo" (exit 2) when the first word that is not a global
// option names no subcommand; CLI11 alone would say "arguments were not
// expected".
bool UnknownCommand(CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--socket") {
      ++i;
      continue;
    }
    if (a.empty() || a[0] == '-') continue;
    for (const CLI::App* sub : app.get_subcommands({})) {
      if (sub->get_name() == a) return false;
    }
    std::cerr << "kregctl: unknown command " << a
              << " (commands: " << CommandList(app)
              << "); run kregctl --help\n";
    return true;
  }
  return false;
}

// KREGD_SOCKET/--socket must name the gRPC socket; the session socket beside
// it speaks another protocol (gRPC would only say "Failed parsing HTTP/2").
bool IsSessionSocket(const std::string& socket) {
  const std::string suffix = ".session";
  if (socket.size() <= suffix.size() ||
      socket.compare(socket.size() - suffix.size(), suffix.size(), suffix) !=
          0) {
    return false;
  }
  std::cerr << "kregctl: " << socket
            << " is kregd's session socket (the data plane of "
               "libkreg_client.so); --socket and KREGD_SOCKET take its gRPC "
               "socket: "
            << socket.substr(0, socket.size() - suffix.size()) << "\n";
  return true;
}

// Upload progress on stderr, only when it is a terminal.
void ShowProgress(uint64_t sent, uint64_t total) {
  std::fprintf(stderr, "\ruploading %.1f / %.1f MiB (%3d%%)",
               static_cast<double>(sent) / (1 << 20),
               static_cast<double>(total) / (1 << 20),
               static_cast<int>(total == 0 ? 100 : sent * 100 / total));
  if (sent >= total) std::fprintf(stderr, "\n");
}

// Modules at least this large show upload progress on a terminal.
constexpr uint64_t kProgressBytes = 8ull << 20;

// One "key: value" line per field, strings unquoted.
void PrintFields(const json& j) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    std::cout << it.key() << ": "
              << (it->is_string() ? it->get<std::string>() : it->dump())
              << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kregctl: inspect and drive kregd"};
  app.require_subcommand(1);
  app.set_version_flag("--version",
                       std::string("kregctl ") + kreg::kKregVersion);
  std::string socket = kreg::DefaultSocketPath();
  if (const char* env = std::getenv("KREGD_SOCKET")) socket = env;
  app.add_option("--socket", socket, "kregd's gRPC socket")
      ->capture_default_str();
  bool as_json = false;

  bool cluster_wide = false;
  CLI::App* list = app.add_subcommand("list", "list registered targets");
  list->add_flag("--json", as_json, "print JSON");
  list->add_flag("--cluster", cluster_wide,
                 "cluster mode: every binding in etcd, with the host that "
                 "made it");
  CLI::App* hosts = app.add_subcommand(
      "hosts", "cluster mode: the kregd hosts, their leases and modules");
  hosts->add_flag("--json", as_json, "print JSON");
  CLI::App* show = app.add_subcommand("show", "show one target");
  std::string name, platform;
  show->add_option("NAME", name, "target name")->required();
  show->add_option("--platform", platform, "cpu or cuda (default: all)");
  show->add_flag("--json", as_json, "print JSON");
  kreg::CompileArgs compile_args;
  CLI::App* compile = kreg::AddCompileCommand(app, &compile_args);
  CLI::App* status = app.add_subcommand("status", "daemon status");
  status->add_flag("--json", as_json, "print JSON");
  CLI::App* config = app.add_subcommand(
      "config",
      "kregd's effective configuration as TOML, each value followed by "
      "where it came from (default, config file, --flag)");
  config->add_flag("--json", as_json, "print JSON");
  CLI::App* health = app.add_subcommand("health", "health check");
  CLI::App* sessions = app.add_subcommand(
      "sessions", "list the live client sessions (pid, uid, targets)");
  sessions->add_flag("--json", as_json, "print JSON");
  CLI::App* unq =
      app.add_subcommand("unquarantine",
                         "lift the quarantine of a target that crashed its "
                         "executors");
  int64_t unq_uid = -1;
  unq->add_option("NAME", name, "target name")->required();
  unq->add_option("--platform", platform, "cpu or cuda (default: all)");
  unq->add_option("--uid", unq_uid,
                  "only this caller uid's quarantine (default: all you may "
                  "lift)");
  CLI::App* reg = app.add_subcommand("register", "register a target");
  kreg::RegisterRequest req;
  std::string module_file;
  bool daemon_reads = false;
  reg->add_option("NAME", req.target_name, "target name")->required();
  reg->add_option("--module", module_file, "kernel .so")->required();
  reg->add_option("--function", req.func_name, "handler symbol")->required();
  reg->add_option("--platform", req.platform, "cpu or cuda")
      ->capture_default_str();
  reg->add_option("--content-id", req.content_id, "content identity");
  reg->add_flag("--replace", req.replace, "reserved; see the docs");
  reg->add_flag("--daemon-reads", daemon_reads,
                "send the path for the daemon to read (under its allowed "
                "roots) instead of uploading the bytes");
  CLI::App* retire = app.add_subcommand(
      "retire", "retire a target so its name can be registered again");
  retire->add_option("NAME", name, "target name")->required();
  retire->add_option("--platform", platform, "cpu or cuda (default: all)");
  CLI::App* gc = app.add_subcommand(
      "gc", "remove module store files no registration references");
  if (UnknownCommand(app, argc, argv)) return 2;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (IsSessionSocket(socket)) return 2;

  kreg::Client client(socket);
  if (*list && cluster_wide) {
    return kreg::ListCluster(client, as_json, ToJson, Fail);
  }
  if (*hosts) return kreg::ListHosts(client, as_json, Fail);
  if (*list) {
    auto targets = client.List();
    if (!targets.ok()) return Fail(targets.status());
    if (as_json) {
      json j = json::array();
      for (const Target& t : *targets) j.push_back(ToJson(t));
      std::cout << j.dump(2) << "\n";
    } else {
      PrintTable(*targets);
    }
    return 0;
  }
  if (*show) {
    auto targets = client.Get(name, platform);
    if (!targets.ok()) return Fail(targets.status());
    // Crash counts and quarantine per caller uid (kregd's executors).
    auto crashes = client.Crashes(name);
    std::map<std::string, json> rows;  // platform -> rows
    if (crashes.ok()) {
      for (const auto& r : crashes->rows()) {
        rows[r.platform()].push_back(
            json{{"uid", r.uid()},
                 {"crashes_total", r.crashes_total()},
                 {"crashes_in_window", r.crashes_in_window()},
                 {"quarantined", r.quarantined()},
                 {"last_reason", r.last_reason()},
                 {"last_crash_unix_s", r.last_crash_unix_s()}});
      }
    }
    // Which live processes hold it, and how (DESIGN §11).
    std::map<std::string, json> holders;  // platform -> rows
    auto live = client.Sessions();
    if (live.ok()) {
      for (const auto& s : live->sessions()) {
        for (const auto& t : s.targets()) {
          if (t.target_name() != name) continue;
          holders[t.platform()].push_back(
              json{{"pid", s.pid()},
                   {"uid", s.uid()},
                   {"session_id", s.session_id()},
                   {"mode", t.mode().empty() ? "isolated" : t.mode()}});
        }
      }
    }
    auto with_crashes = [&](const Target& t) {
      json j = ToJson(t);
      auto held = holders.find(t.platform());
      j["bound_by"] = held == holders.end() ? json::array() : held->second;
      auto it = rows.find(t.platform());
      j["crashes"] = it == rows.end() ? json::array() : it->second;
      bool q = false;
      for (const json& r : j["crashes"]) q = q || r["quarantined"].get<bool>();
      j["quarantined"] = q;
      j["stats"] = kreg::StatsJson(t.stats());
      return j;
    };
    if (as_json) {
      json j = json::array();
      for (const Target& t : *targets) j.push_back(with_crashes(t));
      std::cout << j.dump(2) << "\n";
    } else {
      for (const Target& t : *targets) {
        json j = with_crashes(t);
        json crash_rows = j["crashes"];
        json bound_by = j["bound_by"];
        j.erase("crashes");
        j.erase("stats");
        j.erase("bound_by");
        PrintFields(j);
        std::string held;
        for (const json& b : bound_by) {
          if (!held.empty()) held += ", ";
          held += "pid " + std::to_string(b["pid"].get<int>()) + " (" +
                  b["mode"].get<std::string>() + ")";
        }
        std::cout << "bound by: " << (held.empty() ? "-" : held) << "\n";
        std::cout << "calls: " << kreg::StatsLine(t.stats()) << "\n";
        for (const json& r : crash_rows) {
          std::cout << "  crashes (uid " << r["uid"]
                    << "): " << r["crashes_in_window"] << " in window, "
                    << r["crashes_total"] << " total"
                    << (r["quarantined"].get<bool>() ? ", QUARANTINED" : "")
                    << "; last: " << r["last_reason"].get<std::string>()
                    << "\n";
        }
        std::cout << "\n";
      }
    }
    return 0;
  }
  if (*unq) {
    kreg::v1::UnquarantineRequest r;
    r.set_target_name(name);
    r.set_platform(platform);
    if (unq_uid >= 0) {
      r.set_has_uid(true);
      r.set_uid(static_cast<uint32_t>(unq_uid));
    }
    auto lifted = client.Unquarantine(r);
    if (!lifted.ok()) return Fail(lifted.status());
    for (const auto& row : lifted->lifted()) {
      std::cout << "lifted the quarantine of " << row.target_name() << " ("
                << row.platform() << ") for uid " << row.uid() << "\n";
    }
    return 0;
  }
  if (*compile) return kreg::RunCompile(client, compile_args, ToJson, Fail);
  if (*status) {
    auto s = client.Status();
    if (!s.ok()) return Fail(s.status());
    json j{{"version", s->version()},
           {"uptime_s", s->uptime_s()},
           {"targets", s->targets()},
           {"modules_loaded", s->modules_loaded()},
           {"sessions", s->sessions()},
           {"launches", s->launches()},
           {"launch_errors", s->launch_errors()},
           {"registrations_refused", s->registrations_refused()},
           {"state_dir", s->state_dir()},
           {"socket", s->socket_path()},
           {"ffi_api", std::to_string(s->ffi_api_major()) + "." +
                           std::to_string(s->ffi_api_minor())},
           {"isolation", s->isolation()},
           {"executors_started", s->executors_started()},
           {"executor_crashes", s->executor_crashes()},
           {"quarantined", s->quarantined()},
           {"seccomp", s->seccomp()},
           {"max_module_bytes", s->max_module_bytes()},
           {"compile_requests", s->compile_requests()},
           {"compiles", s->compiles()},
           {"compile_cache_hits", s->compile_cache_hits()},
           {"compile_waits", s->compile_waits()},
           {"compile_failures", s->compile_failures()},
           {"compile_cache_bytes", s->compile_cache_bytes()},
           {"compile_cache_entries", s->compile_cache_entries()},
           {"compile_peer_fetches", s->compile_peer_fetches()}};
    // An older kregd does not report GPU sharing.
    if (!s->gpu_sharing().empty()) {
      j["gpu_sharing"] = s->gpu_sharing();
      j["gpu_sharing_note"] = s->gpu_sharing_note();
    }
    if (!s->executor_note().empty()) j["executor_note"] = s->executor_note();
    json execs = json::array();
    for (const auto& e : s->executors()) {
      execs.push_back(json{{"pid", e.pid()},
                           {"group", e.group()},
                           {"uid", e.uid()},
                           {"gid", e.gid()},
                           {"sessions", e.sessions()},
                           {"launches", e.launches()}});
    }
    if (as_json) {
      j["executors"] = execs;
      json stats = json::array();
      for (const auto& t : s->target_stats()) {
        json row = kreg::StatsJson(t);
        row["target_name"] = t.target_name();
        row["platform"] = t.platform();
        stats.push_back(row);
      }
      j["target_stats"] = stats;
      std::cout << j.dump(2) << "\n";
    } else {
      PrintFields(j);
      for (const json& e : execs) {
        std::cout << "executor pid " << e["pid"] << " ("
                  << e["group"].get<std::string>() << ", uid " << e["uid"]
                  << "): " << e["sessions"] << " sessions, " << e["launches"]
                  << " launches\n";
      }
      kreg::PrintStatsTable(s->target_stats());
    }
    return 0;
  }
  if (*sessions) {
    auto list = client.Sessions();
    if (!list.ok()) return Fail(list.status());
    if (as_json) {
      json j = json::array();
      for (const auto& s : list->sessions()) j.push_back(kreg::SessionJson(s));
      std::cout << j.dump(2) << "\n";
    } else {
      kreg::PrintSessionsTable(*list);
    }
    return 0;
  }
  if (*config) {
    auto cfg = client.Config();
    if (!cfg.ok() && cfg.status().code() == absl::StatusCode::kUnimplemented) {
      // A kregd older than kregctl config has no GetConfig.
      std::cerr << "kregd at " << socket
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
  if (*health) {
    absl::Status s = client.Health();
    if (!s.ok()) return Fail(s);
    std::cout << "SERVING\n";
    return 0;
  }
  if (*retire) {
    auto retired = client.Retire(name, platform);
    if (!retired.ok()) return Fail(retired.status());
    for (const Target& t : *retired) {
      std::cout << "retired " << t.target_name() << " (" << t.platform() << ") "
                << t.content_id() << "\n";
    }
    return 0;
  }
  if (*gc) {
    auto out = client.CollectGarbage();
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
  // register
  if (daemon_reads) {
    req.daemon_path = module_file;
  } else {
    struct stat st {};
    if (::stat(module_file.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      std::cerr << "cannot read module file \"" << module_file << "\"\n";
      return 2;
    }
    // The one upload limit is kregd's max_module_bytes: refuse before
    // reading or sending anything (a kregd that does not report it checks
    // on receipt).
    auto daemon = client.Status();
    if (!daemon.ok()) return Fail(daemon.status());
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    if (daemon->max_module_bytes() != 0 && size > daemon->max_module_bytes()) {
      std::cerr << "module \"" << module_file << "\" has " << size
                << " bytes, more than kregd's max_module_bytes ("
                << daemon->max_module_bytes()
                << "); nothing was sent. Raise max_module_bytes in kregd's "
                   "config (or --max-module-bytes)\n";
      return 2;
    }
    std::ifstream in(module_file, std::ios::binary);
    if (!in) {
      std::cerr << "cannot read module file \"" << module_file << "\"\n";
      return 2;
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    req.module_bytes = ss.str();
    req.module_file_name = module_file.substr(module_file.rfind('/') + 1);
    if (req.module_bytes.size() >= kProgressBytes && ::isatty(2))
      req.progress = ShowProgress;
  }
  auto resp = client.Register(req);
  if (!resp.ok()) return Fail(resp.status());
  std::cout << (resp->created() ? "registered " : "already registered ")
            << resp->target().target_name() << " (" << resp->target().platform()
            << ") " << resp->target().content_id() << "\n";
  return 0;
}
