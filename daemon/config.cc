#include "daemon/config.h"

#include <grp.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/paths.h"
#include "common/version.h"
#include "daemon/edit_distance.h"
#include "daemon/metrics/listen_address.h"
#include "toml++/toml.h"

namespace kreg {
namespace {

// spdlog's level names (spdlog::level::from_str maps anything else to
// "off", which would silence the log).
constexpr const char* kLogLevels[] = {"trace",   "debug", "info",     "warn",
                                      "warning", "error", "critical", "off"};

absl::Status CheckLogLevel(const std::string& level, const std::string& from) {
  for (const char* known : kLogLevels) {
    if (level == known) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown log level \"", level, "\" (", from,
                   "); use one of trace, debug, info, warn, error, critical, "
                   "off"));
}

// "on"/"true"/"1" or "off"/"false"/"0" (any case); INVALID_ARGUMENT
// naming `from` and the value otherwise.
absl::StatusOr<bool> ParseOnOff(const std::string& value,
                                const std::string& from) {
  std::string v = value;
  for (char& ch : v) ch = static_cast<char>(std::tolower(ch));
  if (v == "on" || v == "true" || v == "1") return true;
  if (v == "off" || v == "false" || v == "0") return false;
  return absl::InvalidArgumentError(absl::StrCat(
      from, " is \"", value, "\"; use on or off (also true/false, 1/0)"));
}

// A whole number of microseconds in [0, kMaxRingSpinUs]; INVALID_ARGUMENT
// naming `from` and the value otherwise.
absl::StatusOr<int64_t> ParseSpinUs(const std::string& value,
                                    const std::string& from) {
  int64_t n = 0;
  if (!absl::SimpleAtoi(value, &n) || n < 0 || n > kMaxRingSpinUs) {
    return absl::InvalidArgumentError(absl::StrCat(
        from, " is \"", value,
        "\"; use a whole number of microseconds from 0 (sleep at once) to ",
        kMaxRingSpinUs));
  }
  return n;
}

// The field of a positive-integer config key, or null.
uint64_t* NumberKey(const std::string& k, Config* c) {
  if (k == "max_module_bytes") return &c->max_module_bytes;
  if (k == "max_arena_bytes") return &c->max_arena_bytes;
  if (k == "max_buffered_bytes") return &c->max_buffered_bytes;
  if (k == "max_registrations_per_uid") return &c->max_registrations_per_uid;
  if (k == "max_store_bytes_per_uid") return &c->max_store_bytes_per_uid;
  return nullptr;
}

// TOML literals for the dump (written so that each is also valid JSON).
std::string TomlString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += static_cast<char>(ch);
    } else if (ch < 0x20 || ch == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", ch);
      out += buf;
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out + "\"";
}

std::string TomlStrings(const std::vector<std::string>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) out += ", ";
    out += TomlString(v[i]);
  }
  return out + "]";
}

std::string TomlFloat(double d) {
  std::string out = absl::StrCat(d);
  if (out.find_first_of(".e") == std::string::npos) out += ".0";
  return out;
}

std::string TomlInt(int64_t n) { return absl::StrCat(n); }
std::string TomlBool(bool b) { return b ? "true" : "false"; }

// Every key a config file may set, in the order of docs/kregd.toml.example:
// the flag that overrides it ("" when none) and its value as TOML. The
// unknown-key message and the dump (kregctl config) are made from this
// table; ApplyToml parses each key (tests/python/test_docs.py checks that
// the two agree).
struct KeySpec {
  const char* name;
  const char* flag;
  std::string (*toml)(const Config&);
};

const KeySpec kKeys[] = {
    {"socket", "--socket",
     [](const Config& c) { return TomlString(c.socket_path); }},
    {"state_dir", "--state-dir",
     [](const Config& c) { return TomlString(c.state_dir); }},
    {"allowed_roots", "--allow-root",
     [](const Config& c) { return TomlStrings(c.allowed_roots); }},
    {"max_module_bytes", "--max-module-bytes",
     [](const Config& c) {
       return TomlInt(static_cast<int64_t>(c.max_module_bytes));
     }},
    {"max_arena_bytes", "",
     [](const Config& c) {
       return TomlInt(static_cast<int64_t>(c.max_arena_bytes));
     }},
    {"max_buffered_bytes", "",
     [](const Config& c) {
       return TomlInt(static_cast<int64_t>(c.max_buffered_bytes));
     }},
    {"socket_group", "",
     [](const Config& c) { return TomlString(c.socket_group); }},
    {"log_level", "--log-level",
     [](const Config& c) { return TomlString(c.log_level); }},
    {"probe_binary", "",
     [](const Config& c) { return TomlString(c.probe_binary); }},
    {"isolation", "--isolation",
     [](const Config& c) { return TomlString(c.isolation); }},
    {"local_execution", "--local-execution",
     [](const Config& c) { return TomlString(c.local_execution); }},
    {"executor_binary", "--executor-binary",
     [](const Config& c) { return TomlString(c.executor_binary); }},
    {"launch_timeout", "--launch-timeout",
     [](const Config& c) { return TomlFloat(c.launch_timeout_s); }},
    {"quarantine_crashes", "--quarantine-crashes",
     [](const Config& c) { return TomlInt(c.quarantine_crashes); }},
    {"quarantine_window_s", "--quarantine-window",
     [](const Config& c) { return TomlInt(c.quarantine_window_s); }},
    {"executor_idle_s", "",
     [](const Config& c) { return TomlInt(c.executor_idle_s); }},
    {"orphan_timeout", "--orphan-timeout",
     [](const Config& c) { return TomlInt(c.orphan_timeout_s); }},
    {"seccomp", "", [](const Config& c) { return TomlBool(c.seccomp); }},
    {"max_sessions", "",
     [](const Config& c) { return TomlInt(c.max_sessions); }},
    {"max_sessions_per_uid", "",
     [](const Config& c) { return TomlInt(c.max_sessions_per_uid); }},
    {"hello_timeout_s", "",
     [](const Config& c) { return TomlFloat(c.hello_timeout_s); }},
    {"launch_ring", "--launch-ring",
     [](const Config& c) { return TomlBool(c.launch_ring); }},
    {"ring_spin_us", "--ring-spin-us",
     [](const Config& c) { return TomlInt(c.ring_spin_us); }},
    {"max_registrations_per_uid", "--max-registrations-per-uid",
     [](const Config& c) {
       return TomlInt(static_cast<int64_t>(c.max_registrations_per_uid));
     }},
    {"max_store_bytes_per_uid", "--max-store-bytes-per-uid",
     [](const Config& c) {
       return TomlInt(static_cast<int64_t>(c.max_store_bytes_per_uid));
     }},
    {"etcd_endpoints", "--etcd-endpoints",
     [](const Config& c) { return TomlStrings(c.etcd_endpoints); }},
    {"cluster", "--cluster",
     [](const Config& c) { return TomlString(c.cluster); }},
    {"advertise", "--advertise",
     [](const Config& c) { return TomlString(c.advertise); }},
    {"peer_listen", "--peer-listen",
     [](const Config& c) { return TomlString(c.peer_listen); }},
    {"host_name", "--host-name",
     [](const Config& c) { return TomlString(c.host_name); }},
    {"peer_tls_ca", "--peer-tls-ca",
     [](const Config& c) { return TomlString(c.peer_tls_ca); }},
    {"peer_tls_cert", "--peer-tls-cert",
     [](const Config& c) { return TomlString(c.peer_tls_cert); }},
    {"peer_tls_key", "--peer-tls-key",
     [](const Config& c) { return TomlString(c.peer_tls_key); }},
    {"etcd_timeout_s", "",
     [](const Config& c) { return TomlFloat(c.etcd_timeout_s); }},
    {"peer_lease_ttl_s", "",
     [](const Config& c) { return TomlInt(c.peer_lease_ttl_s); }},
    {"metrics_listen", "--metrics-listen",
     [](const Config& c) { return TomlString(c.metrics_listen); }},
    {"metrics_allow_remote", "--metrics-allow-remote",
     [](const Config& c) { return TomlBool(c.metrics_allow_remote); }},
    // The compile service (config_compile.cc).
    {"max_parallel_compiles", "",
     [](const Config& c) { return TomlInt(c.max_parallel_compiles); }},
    {"compile_cpu_s", "",
     [](const Config& c) { return TomlInt(c.compile_cpu_s); }},
    {"compile_timeout_s", "",
     [](const Config& c) { return TomlFloat(c.compile_timeout_s); }},
    {"compile_memory_bytes", "",
     [](const Config& c) {
       return TomlInt(static_cast<int64_t>(c.compile_memory_bytes));
     }},
    {"compile_output_bytes", "",
     [](const Config& c) {
       return TomlInt(static_cast<int64_t>(c.compile_output_bytes));
     }},
    {"compile_max_processes", "",
     [](const Config& c) { return TomlInt(c.compile_max_processes); }},
    {"compile_cache_bytes", "",
     [](const Config& c) {
       return TomlInt(static_cast<int64_t>(c.compile_cache_bytes));
     }},
    {"compile_cxx", "",
     [](const Config& c) { return TomlString(c.compile_cxx); }},
    {"compile_nvcc", "",
     [](const Config& c) { return TomlString(c.compile_nvcc); }},
    {"compile_ffi_include_dir", "",
     [](const Config& c) { return TomlString(c.compile_ffi_include_dir); }},
    {"compile_binary", "",
     [](const Config& c) { return TomlString(c.compile_binary); }},
};

// The keys, comma-separated, for the unknown-key message.
std::string KnownKeys() {
  std::string out;
  for (const KeySpec& k : kKeys) {
    if (!out.empty()) out += ", ";
    out += k.name;
  }
  return out;
}

std::string UnknownKeyText(const std::string& path, const std::string& key) {
  std::string best;
  size_t best_distance = 3;  // a suggestion only within 2 edits
  for (const KeySpec& known : kKeys) {
    size_t d = EditDistance(key, known.name);
    if (d < best_distance) {
      best_distance = d;
      best = known.name;
    }
  }
  std::string suggestion =
      best.empty() ? "" : absl::StrCat("did you mean \"", best, "\"? ");
  return absl::StrCat("config file ", path, ": unknown key \"", key, "\" (",
                      suggestion, "known: ", KnownKeys(), ")");
}

absl::Status ApplyToml(const std::string& path, Config* c) {
  toml::table t;
  if (::access(path.c_str(), R_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config file ", path, " cannot be read: ", strerror(errno)));
  }
  try {
    t = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("config file ", path, ": ", std::string(e.description()),
                     " at line ", e.source().begin.line));
  }
  for (const auto& [key, value] : t) {
    std::string k(std::string(key.str()));
    auto bad = [&](absl::string_view want) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config file ", path, ": key \"", k, "\" must be ", want));
    };
    if (k == "isolation" || k == "executor_binary" || k == "metrics_listen" ||
        k == "local_execution") {
      auto s = value.value<std::string>();
      if (!s) return bad("a string");
      (k == "isolation"         ? c->isolation
       : k == "executor_binary" ? c->executor_binary
       : k == "local_execution" ? c->local_execution
                                : c->metrics_listen) = *s;
    } else if (k == "launch_ring") {
      auto b = value.value<bool>();
      if (!b) return bad("true or false");
      c->launch_ring = *b;
    } else if (k == "ring_spin_us") {
      auto n = value.value<int64_t>();
      if (!n || *n < 0 || *n > kMaxRingSpinUs) {
        return bad(absl::StrCat(
            "a whole number of microseconds from 0 to ", kMaxRingSpinUs,
            n ? absl::StrCat(", not ", *n) : std::string(", not a number")));
      }
      c->ring_spin_us = *n;
    } else if (k == "hello_timeout_s") {
      auto d = value.value<double>();
      if (!d || *d <= 0) return bad("a number of seconds > 0");
      c->hello_timeout_s = *d;
    } else if (k == "orphan_timeout") {
      auto n = value.value<int64_t>();
      if (!n || *n < 0 || *n > 86400) {
        return bad(
            "a whole number of seconds from 0 to 86400 (0: executors "
            "stop with kregd)");
      }
      c->orphan_timeout_s = *n;
    } else if (k == "launch_timeout") {
      auto d = value.value<double>();
      if (!d || *d < 0) return bad("a number of seconds >= 0 (0: off)");
      c->launch_timeout_s = *d;
    } else if (k == "seccomp" || k == "metrics_allow_remote") {
      auto b = value.value<bool>();
      if (!b) return bad("true or false");
      (k == "seccomp" ? c->seccomp : c->metrics_allow_remote) = *b;
    } else if (k == "quarantine_crashes" || k == "quarantine_window_s" ||
               k == "executor_idle_s" || k == "max_sessions" ||
               k == "max_sessions_per_uid") {
      auto n = value.value<int64_t>();
      if (!n || *n < 0 || *n > (int64_t{1} << 31)) {
        return bad("a non-negative integer");
      }
      if (k == "quarantine_crashes")
        c->quarantine_crashes = static_cast<int>(*n);
      if (k == "quarantine_window_s") c->quarantine_window_s = *n;
      if (k == "executor_idle_s") c->executor_idle_s = *n;
      if (k == "max_sessions") c->max_sessions = static_cast<int>(*n);
      if (k == "max_sessions_per_uid") {
        c->max_sessions_per_uid = static_cast<int>(*n);
      }
    } else if (k == "socket" || k == "state_dir" || k == "socket_group" ||
               k == "log_level" || k == "probe_binary") {
      auto s = value.value<std::string>();
      if (!s) return bad("a string");
      if (k == "socket") c->socket_path = *s;
      if (k == "state_dir") c->state_dir = *s;
      if (k == "socket_group") c->socket_group = *s;
      if (k == "log_level") c->log_level = *s;
      if (k == "probe_binary") c->probe_binary = *s;
    } else if (absl::Status cst; ApplyClusterKey(path, k, &value, c, &cst)) {
      if (!cst.ok()) return cst;
    } else if (absl::Status cst; ApplyCompileKey(path, k, &value, c, &cst)) {
      if (!cst.ok()) return cst;
    } else if (uint64_t* field = NumberKey(k, c)) {
      auto n = value.value<int64_t>();
      if (!n || *n <= 0) return bad("a positive integer");
      *field = static_cast<uint64_t>(*n);
    } else if (k == "allowed_roots") {
      const toml::array* a = value.as_array();
      if (a == nullptr) return bad("an array of directory paths");
      for (const auto& e : *a) {
        auto s = e.value<std::string>();
        if (!s) return bad("an array of directory paths");
        c->allowed_roots.push_back(*s);
      }
    } else {
      return absl::InvalidArgumentError(UnknownKeyText(path, k));
    }
    c->origins[k] = path;
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<ConfigEntry> DescribeConfig(const Config& c) {
  std::vector<ConfigEntry> out;
  for (const KeySpec& k : kKeys) {
    auto origin = c.origins.find(k.name);
    out.push_back({k.name, k.toml(c),
                   origin == c.origins.end() ? "default" : origin->second});
  }
  return out;
}

std::string ConfigToml(const Config& c) {
  std::string out = absl::StrCat(
      "# kregd ", kKregVersion,
      ": the effective configuration (kregctl config); kregd accepts\n"
      "# it back with --config. After each value: where it came from.\n");
  if (!c.config_file.empty()) {
    absl::StrAppend(&out, "# config file: ", c.config_file, "\n");
  }
  for (const ConfigEntry& e : DescribeConfig(c)) {
    // An origin is a path or a flag: one line, no comment breaks.
    std::string origin = e.origin;
    std::replace(origin.begin(), origin.end(), '\n', ' ');
    absl::StrAppend(&out, e.key, " = ", e.value_toml, "  # ", origin, "\n");
  }
  return out;
}

absl::StatusOr<Config> ParseConfig(int argc, char** argv, bool* exit_now) {
  *exit_now = false;
  Config c;
  std::string config_file, socket, state_dir, log_level;
  std::vector<std::string> roots;
  uint64_t max_module = 0, max_registrations = 0, max_store_bytes = 0;
  CLI::App app{
      "kregd: out-of-process kernel registry and executor for JAX's "
      "XLA FFI"};
  app.add_option("--config", config_file, "TOML config file");
  app.add_option("--socket", socket, "gRPC Unix socket path")
      ->default_str(DefaultSocketPath());
  app.add_option("--state-dir", state_dir, "journal and module store")
      ->default_str(DefaultStateDir());
  app.add_option("--allow-root", roots,
                 "directory the daemon may read module paths from "
                 "(repeatable)");
  app.add_option("--max-module-bytes", max_module, "largest module accepted");
  app.add_option("--max-registrations-per-uid", max_registrations,
                 "registrations one uid may hold (root exempt)")
      ->default_str("1024");
  app.add_option("--max-store-bytes-per-uid", max_store_bytes,
                 "module store bytes one uid's registrations may reference "
                 "(root exempt)")
      ->default_str("4294967296");
  app.add_option("--log-level", log_level,
                 "trace|debug|info|warn|error|critical|off");
  app.set_version_flag("--version", absl::StrCat("kregd ", kKregVersion));
  std::string isolation, executor_binary;
  double launch_timeout = -1;
  int64_t orphan_timeout = -1;
  int quarantine_crashes = -1;
  int64_t quarantine_window = -1;
  app.add_option("--isolation", isolation,
                 "executor grouping: client (default), uid or shared");
  std::string local_execution;
  app.add_option("--local-execution", local_execution,
                 "allow (default) or deny: whether clients may run "
                 "registered kernels in their own process");
  app.add_option("--executor-binary", executor_binary,
                 "kregd-exec to start (default: next to kregd)");
  app.add_option("--launch-timeout", launch_timeout,
                 "seconds a handler may run before its executor is killed "
                 "(0: off, the default)");
  app.add_option("--orphan-timeout", orphan_timeout,
                 "seconds executors serve their sessions on after kregd "
                 "stops or dies (default 300; 0: they stop with kregd)")
      ->check(CLI::Range(int64_t{0}, int64_t{86400}));
  app.add_option("--quarantine-crashes", quarantine_crashes,
                 "crashes within the window that quarantine a target "
                 "(default 3; 0: never)");
  app.add_option("--quarantine-window", quarantine_window,
                 "the quarantine window in seconds (default 600)");
  std::string etcd_endpoints, cluster, advertise, peer_listen, host_name;
  std::string tls_ca, tls_cert, tls_key;
  app.add_option("--etcd-endpoints", etcd_endpoints,
                 "cluster mode: etcd members, URL[,URL...] "
                 "(http://HOST:PORT)");
  app.add_option("--cluster", cluster,
                 "cluster mode: the cluster's name (default \"default\")");
  app.add_option("--advertise", advertise,
                 "cluster mode: HOST:PORT other hosts fetch modules from");
  app.add_option("--peer-listen", peer_listen,
                 "cluster mode: HOST:PORT to serve peers on (default: the "
                 "--advertise address)");
  app.add_option("--host-name", host_name,
                 "cluster mode: this host's name in messages (default: its "
                 "hostname)");
  app.add_option("--peer-tls-ca", tls_ca,
                 "cluster mode: CA certificate (PEM) peers' certificates "
                 "must be signed by");
  app.add_option("--peer-tls-cert", tls_cert,
                 "cluster mode: this host's certificate (PEM)");
  app.add_option("--peer-tls-key", tls_key,
                 "cluster mode: this host's private key (PEM)");
  std::string metrics_listen;
  bool metrics_allow_remote = false;
  app.add_option("--metrics-listen", metrics_listen,
                 "serve Prometheus metrics at http://ADDR/metrics: "
                 "127.0.0.1:PORT, [::1]:PORT or unix:/path (default: off)");
  app.add_flag("--metrics-allow-remote", metrics_allow_remote,
               "allow a --metrics-listen address that is not loopback");
  std::string launch_ring_flag, ring_spin_flag;
  app.add_option("--launch-ring", launch_ring_flag,
                 "offer clients the shared-memory launch ring for CPU "
                 "launches: on (default) or off");
  app.add_option("--ring-spin-us", ring_spin_flag,
                 "microseconds an executor's ring thread spins for the next "
                 "launch before it sleeps (default 50; 0 to 1000000)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    std::cout << app.help();
    *exit_now = true;
    return c;
  } catch (const CLI::CallForVersion& e) {
    std::cout << e.what() << "\n";
    *exit_now = true;
    return c;
  } catch (const CLI::ParseError& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(e.what(), "; run kregd --help for the flags"));
  }
  // The environment variables these keys replaced still work, below the
  // config file and the flags.
  if (const char* env = std::getenv("KREGD_LAUNCH_RING")) {
    absl::StatusOr<bool> on = ParseOnOff(env, "$KREGD_LAUNCH_RING");
    if (!on.ok()) return on.status();
    c.launch_ring = *on;
    c.origins["launch_ring"] = "$KREGD_LAUNCH_RING";
  }
  if (const char* env = std::getenv("KREGD_RING_SPIN_US")) {
    absl::StatusOr<int64_t> us = ParseSpinUs(env, "$KREGD_RING_SPIN_US");
    if (!us.ok()) return us.status();
    c.ring_spin_us = *us;
    c.origins["ring_spin_us"] = "$KREGD_RING_SPIN_US";
  }
  c.config_file = config_file;
  if (!config_file.empty()) {
    absl::Status st = ApplyToml(config_file, &c);
    if (!st.ok()) return st;
  }
  if (!launch_ring_flag.empty()) {
    absl::StatusOr<bool> on = ParseOnOff(launch_ring_flag, "--launch-ring");
    if (!on.ok()) return on.status();
    c.launch_ring = *on;
  }
  if (!ring_spin_flag.empty()) {
    absl::StatusOr<int64_t> us = ParseSpinUs(ring_spin_flag, "--ring-spin-us");
    if (!us.ok()) return us.status();
    c.ring_spin_us = *us;
  }
  if (!socket.empty()) c.socket_path = socket;
  if (!state_dir.empty()) c.state_dir = state_dir;
  if (!log_level.empty()) c.log_level = log_level;
  absl::Status level = CheckLogLevel(
      c.log_level,
      log_level.empty() ? "log_level in the config file" : "--log-level");
  if (!level.ok()) return level;
  if (max_module != 0) c.max_module_bytes = max_module;
  if (max_registrations != 0) c.max_registrations_per_uid = max_registrations;
  if (max_store_bytes != 0) c.max_store_bytes_per_uid = max_store_bytes;
  if (!isolation.empty()) c.isolation = isolation;
  if (!local_execution.empty()) c.local_execution = local_execution;
  if (!executor_binary.empty()) c.executor_binary = executor_binary;
  if (launch_timeout >= 0) c.launch_timeout_s = launch_timeout;
  if (orphan_timeout >= 0) c.orphan_timeout_s = orphan_timeout;
  if (quarantine_crashes >= 0) c.quarantine_crashes = quarantine_crashes;
  if (quarantine_window >= 0) c.quarantine_window_s = quarantine_window;
  if (!etcd_endpoints.empty()) {
    c.etcd_endpoints = absl::StrSplit(etcd_endpoints, ',', absl::SkipEmpty());
  }
  for (auto [flag, field] : {std::pair{&cluster, &c.cluster},
                             {&advertise, &c.advertise},
                             {&peer_listen, &c.peer_listen},
                             {&host_name, &c.host_name},
                             {&tls_ca, &c.peer_tls_ca},
                             {&tls_cert, &c.peer_tls_cert},
                             {&tls_key, &c.peer_tls_key}}) {
    if (!flag->empty()) *field = *flag;
  }
  absl::Status cluster_ok = FinishClusterConfig(&c);
  if (!cluster_ok.ok()) return cluster_ok;
  if (!metrics_listen.empty()) c.metrics_listen = metrics_listen;
  if (metrics_allow_remote) c.metrics_allow_remote = true;
  if (!c.metrics_listen.empty()) {
    absl::StatusOr<MetricsAddress> address =
        ParseMetricsAddress(c.metrics_listen, c.metrics_allow_remote);
    if (!address.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          address.status().message(),
          metrics_listen.empty() ? " (config file)" : " (--metrics-listen)"));
    }
  }
  {
    std::string iso = c.isolation;
    for (char& ch : iso) ch = static_cast<char>(std::tolower(ch));
    if (iso != "uid" && iso != "client" && iso != "shared") {
      return absl::InvalidArgumentError(
          absl::StrCat("isolation \"", c.isolation,
                       "\" is not one of uid, client, shared (see --help)"));
    }
    c.isolation = iso;
  }
  {
    std::string policy = c.local_execution;
    for (char& ch : policy) ch = static_cast<char>(std::tolower(ch));
    if (policy != "allow" && policy != "deny") {
      return absl::InvalidArgumentError(absl::StrCat(
          "local_execution \"", c.local_execution, "\" (",
          local_execution.empty() ? "config file" : "--local-execution",
          ") is not one of allow, deny"));
    }
    c.local_execution = policy;
  }
  c.allowed_roots.insert(c.allowed_roots.end(), roots.begin(), roots.end());
  // Flags given on the command line; --allow-root adds to the file's roots.
  for (const KeySpec& k : kKeys) {
    if (k.flag[0] == '\0' || app.count(k.flag) == 0) continue;
    std::string& origin = c.origins[k.name];
    origin = k.name == std::string("allowed_roots") && !origin.empty()
                 ? absl::StrCat(origin, ", ", k.flag)
                 : k.flag;
  }
  if (c.socket_path.empty()) c.socket_path = DefaultSocketPath();
  if (c.state_dir.empty()) c.state_dir = DefaultStateDir();
  for (std::string& root : c.allowed_roots) {
    char resolved[PATH_MAX];
    if (::realpath(root.c_str(), resolved) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "allowed root \"", root, "\" does not exist or cannot be resolved"));
    }
    root = resolved;
  }
  // The group is resolved here, not when the sockets are bound, so that a
  // typo is a configuration error (exit 2) like every other one.
  if (!c.socket_group.empty()) {
    errno = 0;
    if (::getgrnam(c.socket_group.c_str()) == nullptr) {
      const int err = errno;
      return absl::InvalidArgumentError(absl::StrCat(
          "socket_group \"", c.socket_group, "\" (config file) does not exist",
          err != 0 && err != ENOENT && err != ESRCH && err != EBADF &&
                  err != EPERM
              ? absl::StrCat(" or cannot be looked up (", std::strerror(err),
                             ")")
              : std::string(),
          "; give an existing group (getent group NAME), or leave "
          "socket_group empty for kregd's own group"));
    }
  }
  return c;
}

}  // namespace kreg
