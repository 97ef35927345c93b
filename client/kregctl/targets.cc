// kregctl list, show, unquarantine and retire: the registered targets.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "client/kregctl/common.h"

namespace kreg {
namespace {

using json = nlohmann::ordered_json;
using v1::Target;

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
                UtcTime(t.audit().registered_at_us()).c_str(),
                t.audit().origin().c_str());
  }
  for (const Target* t : not_runnable) {
    std::printf("not runnable here: %s (%s): %s\n", t->target_name().c_str(),
                t->platform().c_str(), t->not_runnable().c_str());
  }
}

struct ListOptions {
  bool as_json = false;
  bool cluster_wide = false;
};

int RunList(Connection& kregd, const ListOptions& opts) {
  if (opts.cluster_wide) return ListCluster(*kregd.client, opts.as_json);
  auto targets = kregd.client->List();
  if (!targets.ok()) return Fail(targets.status());
  if (opts.as_json) {
    json j = json::array();
    for (const Target& t : *targets) j.push_back(TargetJson(t));
    std::cout << j.dump(2) << "\n";
  } else {
    PrintTable(*targets);
  }
  return 0;
}

// NAME and --platform of show, unquarantine and retire.
struct TargetOptions {
  std::string name;
  std::string platform;
  bool as_json = false;  // show
  int64_t uid = -1;      // unquarantine
};

void AddTargetOptions(CLI::App* cmd, TargetOptions* opts) {
  cmd->add_option("NAME", opts->name, "target name")->required();
  cmd->add_option("--platform", opts->platform, "cpu or cuda (default: all)");
}

// What `show` adds to each target, per platform: crash counts and
// quarantine per caller uid (kregd's executors), and which live processes
// hold it and how (DESIGN §11).
struct ShowExtras {
  std::map<std::string, json> crashes;
  std::map<std::string, json> holders;
};

ShowExtras ReadShowExtras(Client& client, const std::string& name) {
  ShowExtras out;
  auto crashes = client.Crashes(name);
  if (crashes.ok()) {
    for (const auto& r : crashes->rows()) {
      out.crashes[r.platform()].push_back(
          json{{"uid", r.uid()},
               {"crashes_total", r.crashes_total()},
               {"crashes_in_window", r.crashes_in_window()},
               {"quarantined", r.quarantined()},
               {"last_reason", r.last_reason()},
               {"last_crash_unix_s", r.last_crash_unix_s()}});
    }
  }
  auto live = client.Sessions();
  if (live.ok()) {
    for (const auto& s : live->sessions()) {
      for (const auto& t : s.targets()) {
        if (t.target_name() != name) continue;
        out.holders[t.platform()].push_back(
            json{{"pid", s.pid()},
                 {"uid", s.uid()},
                 {"session_id", s.session_id()},
                 {"mode", t.mode().empty() ? "isolated" : t.mode()},
                 {"generation", t.generation()}});
      }
    }
  }
  return out;
}

// The calls of generation `g` of `t` (none when it has no row).
v1::TargetStats StatsOfGeneration(const Target& t, uint32_t g) {
  for (const v1::TargetStats& s : t.generation_stats()) {
    if (s.generation() == g) return s;
  }
  return v1::TargetStats();
}

json ShowJson(const Target& t, const ShowExtras& extras) {
  json j = TargetJson(t);
  auto held = extras.holders.find(t.platform());
  j["bound_by"] = held == extras.holders.end() ? json::array() : held->second;
  auto it = extras.crashes.find(t.platform());
  j["crashes"] = it == extras.crashes.end() ? json::array() : it->second;
  bool q = false;
  for (const json& r : j["crashes"]) q = q || r["quarantined"].get<bool>();
  j["quarantined"] = q;
  j["stats"] = StatsJson(t.stats());
  // docs/replace.md: generation 1 until replaced; then every generation.
  j["generation"] = std::max<uint32_t>(t.generation(), 1);
  j["generations"] = json::array();
  for (const v1::Generation& g : t.generations()) {
    j["generations"].push_back(
        json{{"generation", g.generation()},
             {"content_id", g.content_id()},
             {"module_digest", g.module_digest()},
             {"func_name", g.func_name()},
             {"uid", g.uid()},
             {"pid", g.pid()},
             {"at", UtcTime(g.at_us())},
             {"origin", g.origin()},
             {"stats", StatsJson(StatsOfGeneration(t, g.generation()))}});
  }
  return j;
}

void PrintShowText(const Target& t, json j) {
  json crash_rows = j["crashes"];
  json bound_by = j["bound_by"];
  json generations = j["generations"];
  j.erase("crashes");
  j.erase("stats");
  j.erase("bound_by");
  j.erase("generations");
  PrintFields(j);
  for (const json& g : generations) {
    std::cout << "  generation " << g["generation"] << ": content "
              << g["content_id"].get<std::string>() << ", function \""
              << g["func_name"].get<std::string>() << "\", by uid " << g["uid"]
              << " at " << g["at"].get<std::string>() << " ("
              << g["origin"].get<std::string>() << ")\n    calls: "
              << StatsLine(
                     StatsOfGeneration(t, g["generation"].get<uint32_t>()))
              << "\n";
  }
  std::string held;
  for (const json& b : bound_by) {
    if (!held.empty()) held += ", ";
    // docs/replace.md: the generation it runs, once the target was replaced.
    const uint32_t g = b["generation"].get<uint32_t>();
    held += "pid " + std::to_string(b["pid"].get<int>()) + " (" +
            b["mode"].get<std::string>() +
            (g > 1 ? ", generation " + std::to_string(g) : "") + ")";
  }
  std::cout << "bound by: " << (held.empty() ? "-" : held) << "\n";
  std::cout << "calls: " << StatsLine(t.stats()) << "\n";
  for (const json& r : crash_rows) {
    std::cout << "  crashes (uid " << r["uid"]
              << "): " << r["crashes_in_window"] << " in window, "
              << r["crashes_total"] << " total"
              << (r["quarantined"].get<bool>() ? ", QUARANTINED" : "")
              << "; last: " << r["last_reason"].get<std::string>() << "\n";
  }
  std::cout << "\n";
}

int RunShow(Connection& kregd, const TargetOptions& opts) {
  auto targets = kregd.client->Get(opts.name, opts.platform);
  if (!targets.ok()) return Fail(targets.status());
  const ShowExtras extras = ReadShowExtras(*kregd.client, opts.name);
  if (opts.as_json) {
    json j = json::array();
    for (const Target& t : *targets) j.push_back(ShowJson(t, extras));
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  for (const Target& t : *targets) PrintShowText(t, ShowJson(t, extras));
  return 0;
}

int RunUnquarantine(Connection& kregd, const TargetOptions& opts) {
  v1::UnquarantineRequest r;
  r.set_target_name(opts.name);
  r.set_platform(opts.platform);
  if (opts.uid >= 0) {
    r.set_has_uid(true);
    r.set_uid(static_cast<uint32_t>(opts.uid));
  }
  auto lifted = kregd.client->Unquarantine(r);
  if (!lifted.ok()) return Fail(lifted.status());
  for (const auto& row : lifted->lifted()) {
    std::cout << "lifted the quarantine of " << row.target_name() << " ("
              << row.platform() << ") for uid " << row.uid() << "\n";
  }
  return 0;
}

int RunRetire(Connection& kregd, const TargetOptions& opts) {
  auto retired = kregd.client->Retire(opts.name, opts.platform);
  if (!retired.ok()) return Fail(retired.status());
  for (const Target& t : *retired) {
    std::cout << "retired " << t.target_name() << " (" << t.platform() << ") "
              << t.content_id() << "\n";
  }
  return 0;
}

struct ReserveOptions {
  std::string pattern;
  std::string owner;
  bool lift = false;
  bool as_json = false;
};

int RunReserve(Connection& kregd, const ReserveOptions& opts) {
  if (!opts.pattern.empty() && !opts.lift && opts.owner.empty()) {
    return Fail(absl::InvalidArgumentError(
        "kregctl reserve PATTERN needs --owner (a user name or uid, or "
        "group:NAME), or --lift to lift the reservation"));
  }
  v1::ReserveNamesRequest r;
  r.set_pattern(opts.pattern);
  r.set_owner(opts.owner);
  r.set_lift(opts.lift);
  auto in_effect = kregd.client->ReserveNames(r);
  if (!in_effect.ok()) return Fail(in_effect.status());
  json j = json::array();
  for (const v1::NameReservation& n : in_effect->reservations()) {
    j.push_back(json{{"pattern", n.pattern()},
                     {"owner", n.owner()},
                     {"reserved_by_uid", n.reserved_by_uid()},
                     {"reserved_at_us", n.reserved_at_us()}});
    if (!opts.as_json) {
      std::cout << n.pattern() << "\t" << n.owner() << "\treserved by uid "
                << n.reserved_by_uid() << "\n";
    }
  }
  if (opts.as_json) {
    std::cout << j.dump(2) << "\n";
  } else if (opts.pattern.empty() && j.empty()) {
    std::cout << "no target names are reserved on this host\n";
  }
  return 0;
}

}  // namespace

Command AddReserveCommand(CLI::App& app) {
  auto opts = std::make_shared<ReserveOptions>();
  CLI::App* cmd = app.add_subcommand(
      "reserve",
      "reserve target names for a user or group (root); without PATTERN, "
      "list the reservations");
  cmd->add_option("PATTERN", opts->pattern,
                  "a target name, or a name prefix followed by '*'");
  cmd->add_option("--owner", opts->owner,
                  "who may register matching names: a user name or uid, or "
                  "group:NAME or group:GID");
  cmd->add_flag("--lift", opts->lift, "lift the reservation of PATTERN");
  cmd->add_flag("--json", opts->as_json, "print JSON");
  return {cmd, [opts](Connection& kregd) { return RunReserve(kregd, *opts); }};
}

Command AddListCommand(CLI::App& app) {
  auto opts = std::make_shared<ListOptions>();
  CLI::App* cmd = app.add_subcommand("list", "list registered targets");
  cmd->add_flag("--json", opts->as_json, "print JSON");
  cmd->add_flag("--cluster", opts->cluster_wide,
                "cluster mode: every binding in etcd, with the host that "
                "made it");
  return {cmd, [opts](Connection& kregd) { return RunList(kregd, *opts); }};
}

Command AddShowCommand(CLI::App& app) {
  auto opts = std::make_shared<TargetOptions>();
  CLI::App* cmd = app.add_subcommand("show", "show one target");
  AddTargetOptions(cmd, opts.get());
  cmd->add_flag("--json", opts->as_json, "print JSON");
  return {cmd, [opts](Connection& kregd) { return RunShow(kregd, *opts); }};
}

Command AddUnquarantineCommand(CLI::App& app) {
  auto opts = std::make_shared<TargetOptions>();
  CLI::App* cmd =
      app.add_subcommand("unquarantine",
                         "lift the quarantine of a target that crashed its "
                         "executors");
  AddTargetOptions(cmd, opts.get());
  cmd->add_option("--uid", opts->uid,
                  "only this caller uid's quarantine (default: all you may "
                  "lift)");
  return {cmd,
          [opts](Connection& kregd) { return RunUnquarantine(kregd, *opts); }};
}

Command AddRetireCommand(CLI::App& app) {
  auto opts = std::make_shared<TargetOptions>();
  CLI::App* cmd = app.add_subcommand(
      "retire", "retire a target so its name can be registered again");
  AddTargetOptions(cmd, opts.get());
  return {cmd, [opts](Connection& kregd) { return RunRetire(kregd, *opts); }};
}

}  // namespace kreg
