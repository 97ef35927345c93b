#include "daemon/config/config_keys.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <type_traits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "daemon/base/edit_distance.h"

namespace kreg {
namespace config_internal {
namespace {

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

KeySpec KeyString(const char* name, const char* flag,
                  std::string Config::*field) {
  return {name, flag, field, "a string"};
}
KeySpec KeyBool(const char* name, const char* flag, bool Config::*field) {
  return {name, flag, field, "true or false"};
}
template <typename T>
KeySpec KeyInt(const char* name, const char* flag, T Config::*field,
               bool (*ok)(int64_t), const char* must_be) {
  KeySpec k{name, flag, field, must_be};
  k.int_ok = ok;
  return k;
}
KeySpec KeyFloat(const char* name, const char* flag, double Config::*field,
                 bool (*ok)(double), const char* must_be) {
  KeySpec k{name, flag, field, must_be};
  k.float_ok = ok;
  return k;
}
KeySpec KeyStrings(const char* name, const char* flag,
                   std::vector<std::string> Config::*field,
                   const char* must_be) {
  return {name, flag, field, must_be};
}
KeySpec KeyCustom(const char* name, const char* flag, Field field,
                  const char* must_be, CustomToml custom, TextFlag text_flag) {
  KeySpec k{name, flag, field, must_be};
  k.custom = custom;
  k.text_flag = text_flag;
  return k;
}

bool Positive(int64_t n) { return n > 0; }
bool UpTo2To31(int64_t n) { return n >= 0 && n <= (int64_t{1} << 31); }
bool Connections(int64_t n) { return n > 0 && n <= 1000000; }
bool GrpcThreads(int64_t n) { return n >= 8 && n <= 100000; }
bool OrphanSeconds(int64_t n) { return n >= 0 && n <= 86400; }
bool ReplaceSeconds(int64_t n) { return n >= 1 && n <= 60; }
bool GenerationCount(int64_t n) { return n >= 2 && n <= 1024; }
bool LeaseSeconds(int64_t n) { return n >= 2 && n <= 3600; }
bool NotNegative(double d) { return d >= 0; }
bool EtcdSeconds(double d) { return d > 0 && d <= 600; }

bool RingSpinToml(const toml::node& value, Config* c, std::string* must_be) {
  auto n = value.value<int64_t>();
  if (!n || *n < 0 || *n > kMaxRingSpinUs) {
    *must_be = absl::StrCat(
        "a whole number of microseconds from 0 to ", kMaxRingSpinUs,
        n ? absl::StrCat(", not ", *n) : std::string(", not a number"));
    return false;
  }
  c->ring_spin_us = *n;
  return true;
}

absl::Status RingSpinFlag(const std::string& text, const char* flag,
                          Config* c) {
  KREG_ASSIGN_OR_RETURN(c->ring_spin_us, ParseSpinUs(text, flag));
  return absl::OkStatus();
}

// A boolean key whose flag takes on/off (ParseOnOff).
absl::Status LaunchRingFlag(const std::string& text, const char* flag,
                            Config* c) {
  KREG_ASSIGN_OR_RETURN(c->launch_ring, ParseOnOff(text, flag));
  return absl::OkStatus();
}

// An array of URLs, or one comma-separated string (which the flag takes).
bool EtcdEndpointsToml(const toml::node& value, Config* c,
                       std::string* must_be) {
  if (auto s = value.value<std::string>()) {
    c->etcd_endpoints = absl::StrSplit(*s, ',', absl::SkipEmpty());
    return true;
  }
  const toml::array* a = value.as_array();
  if (a == nullptr) {
    *must_be = "an array of URLs (or one comma-separated string)";
    return false;
  }
  c->etcd_endpoints.clear();
  for (const auto& e : *a) {
    auto s = e.value<std::string>();
    if (!s) {
      *must_be = "an array of URLs";
      return false;
    }
    c->etcd_endpoints.push_back(*s);
  }
  return true;
}

// An absolute path, or empty (the default) for a compile tool's path key.
template <std::string Config::*F>
bool AbsolutePathToml(const toml::node& value, Config* c,
                      std::string* must_be) {
  auto s = value.value<std::string>();
  if (!s || (!s->empty() && (*s)[0] != '/')) {
    *must_be = "an absolute path";
    return false;
  }
  c->*F = *s;
  return true;
}

bool CompileCount(int64_t n) { return n >= 1 && n <= 100000; }
bool ParallelCompiles(int64_t n) { return n >= 0 && n <= 100000; }
bool AtLeastMiB(int64_t n) { return n >= (1 << 20); }
bool NotNegativeInt(int64_t n) { return n >= 0; }
bool UpToADay(double d) { return d > 0 && d <= 86400; }

absl::Status EtcdEndpointsFlag(const std::string& text, const char*,
                               Config* c) {
  c->etcd_endpoints = absl::StrSplit(text, ',', absl::SkipEmpty());
  return absl::OkStatus();
}

}  // namespace

// Long on purpose: one row per key, the table itself (no logic to split).
const std::vector<KeySpec>& Keys() {
  static const auto* keys = new std::vector<KeySpec>{
      KeyString("socket", "--socket", &Config::socket_path),
      KeyString("state_dir", "--state-dir", &Config::state_dir),
      KeyStrings("allowed_roots", "--allow-root", &Config::allowed_roots,
                 "an array of directory paths"),
      KeyInt("max_module_bytes", "--max-module-bytes",
             &Config::max_module_bytes, Positive, "a positive integer"),
      KeyInt("max_arena_bytes", "", &Config::max_arena_bytes, Positive,
             "a positive integer"),
      KeyInt("max_buffered_bytes", "", &Config::max_buffered_bytes, Positive,
             "a positive integer"),
      KeyInt("max_states_per_session", "", &Config::max_states_per_session,
             Positive, "a positive integer"),
      KeyString("socket_group", "--socket-group", &Config::socket_group),
      KeyBool("allow_insecure_dirs", "--allow-insecure-dirs",
              &Config::allow_insecure_dirs),
      KeyString("log_level", "--log-level", &Config::log_level),
      KeyString("probe_binary", "", &Config::probe_binary),
      KeyString("isolation", "--isolation", &Config::isolation),
      KeyString("local_execution", "--local-execution",
                &Config::local_execution),
      KeyString("replace", "--replace", &Config::replace),
      KeyInt("replace_timeout", "--replace-timeout", &Config::replace_timeout_s,
             ReplaceSeconds, "a whole number of seconds from 1 to 60"),
      KeyInt("max_generations_per_target", "",
             &Config::max_generations_per_target, GenerationCount,
             "a whole number from 2 to 1024"),
      KeyInt("max_local_module_memory_bytes", "",
             &Config::max_local_module_memory_bytes, Positive,
             "a positive integer"),
      KeyString("executor_binary", "--executor-binary",
                &Config::executor_binary),
      KeyFloat("launch_timeout", "--launch-timeout", &Config::launch_timeout_s,
               NotNegative, "a number of seconds >= 0 (0: off)"),
      KeyInt("quarantine_crashes", "--quarantine-crashes",
             &Config::quarantine_crashes, UpTo2To31, "a non-negative integer"),
      KeyInt("quarantine_window_s", "--quarantine-window",
             &Config::quarantine_window_s, UpTo2To31, "a non-negative integer"),
      KeyInt("executor_idle_s", "", &Config::executor_idle_s, UpTo2To31,
             "a non-negative integer"),
      KeyInt("orphan_timeout", "--orphan-timeout", &Config::orphan_timeout_s,
             OrphanSeconds,
             "a whole number of seconds from 0 to 86400 (0: executors stop "
             "with kregd)"),
      KeyBool("seccomp", "", &Config::seccomp),
      KeyInt("max_sessions", "", &Config::max_sessions, UpTo2To31,
             "a non-negative integer"),
      KeyInt("max_sessions_per_uid", "", &Config::max_sessions_per_uid,
             UpTo2To31, "a non-negative integer"),
      KeyFloat("hello_timeout_s", "", &Config::hello_timeout_s, UpToADay,
               "a number of seconds > 0 and at most 86400"),
      KeyFloat("probe_timeout_s", "", &Config::probe_timeout_s, UpToADay,
               "a number of seconds > 0 and at most 86400"),
      KeyInt("max_grpc_connections", "", &Config::max_grpc_connections,
             Connections, "a whole number from 1 to 1000000"),
      KeyInt("max_grpc_connections_per_uid", "",
             &Config::max_grpc_connections_per_uid, Connections,
             "a whole number from 1 to 1000000"),
      KeyFloat("grpc_first_message_timeout_s", "",
               &Config::grpc_first_message_timeout_s, UpToADay,
               "a number of seconds > 0 and at most 86400"),
      KeyFloat("grpc_stream_timeout_s", "", &Config::grpc_stream_timeout_s,
               UpToADay, "a number of seconds > 0 and at most 86400"),
      KeyInt("max_control_connections_per_uid", "",
             &Config::max_control_connections_per_uid, Connections,
             "a whole number from 1 to 1000000"),
      KeyInt("max_pending_connections_per_uid", "",
             &Config::max_pending_connections_per_uid, Connections,
             "a whole number from 1 to 1000000"),
      KeyInt("max_watch_connections_per_uid", "",
             &Config::max_watch_connections_per_uid, Connections,
             "a whole number from 1 to 1000000"),
      KeyFloat("control_idle_timeout_s", "", &Config::control_idle_timeout_s,
               UpToADay, "a number of seconds > 0 and at most 86400"),
      KeyInt("max_upload_bytes_per_uid", "", &Config::max_upload_bytes_per_uid,
             NotNegativeInt,
             "a non-negative integer (0: twice max_module_bytes)"),
      KeyInt("max_heavy_work_per_uid", "", &Config::max_heavy_work_per_uid,
             Connections, "a whole number from 1 to 1000000"),
      KeyInt("max_states_per_uid", "", &Config::max_states_per_uid, Connections,
             "a whole number from 1 to 1000000"),
      KeyInt("max_grpc_calls_per_uid", "", &Config::max_grpc_calls_per_uid,
             Connections, "a whole number from 1 to 1000000"),
      KeyInt("max_grpc_streams_per_connection", "",
             &Config::max_grpc_streams_per_connection, Connections,
             "a whole number from 1 to 1000000"),
      KeyInt("grpc_max_threads", "", &Config::grpc_max_threads, GrpcThreads,
             "a whole number from 8 to 100000"),
      KeyCustom("launch_ring", "--launch-ring", &Config::launch_ring,
                "true or false", nullptr, LaunchRingFlag),
      KeyCustom("ring_spin_us", "--ring-spin-us", &Config::ring_spin_us, "",
                RingSpinToml, RingSpinFlag),
      KeyInt("max_registrations_per_uid", "--max-registrations-per-uid",
             &Config::max_registrations_per_uid, Positive,
             "a positive integer"),
      KeyInt("max_store_bytes_per_uid", "--max-store-bytes-per-uid",
             &Config::max_store_bytes_per_uid, Positive, "a positive integer"),
      KeyCustom("etcd_endpoints", "--etcd-endpoints", &Config::etcd_endpoints,
                "", EtcdEndpointsToml, EtcdEndpointsFlag),
      KeyString("cluster", "--cluster", &Config::cluster),
      KeyString("advertise", "--advertise", &Config::advertise),
      KeyString("peer_listen", "--peer-listen", &Config::peer_listen),
      KeyString("host_name", "--host-name", &Config::host_name),
      KeyString("peer_tls_ca", "--peer-tls-ca", &Config::peer_tls_ca),
      KeyString("peer_tls_cert", "--peer-tls-cert", &Config::peer_tls_cert),
      KeyString("peer_tls_key", "--peer-tls-key", &Config::peer_tls_key),
      KeyString("cluster_key_file", "--cluster-key-file",
                &Config::cluster_key_file),
      KeyBool("cluster_insecure", "--cluster-insecure",
              &Config::cluster_insecure),
      KeyFloat("etcd_timeout_s", "", &Config::etcd_timeout_s, EtcdSeconds,
               "a number of seconds in (0, 600]"),
      KeyInt("peer_lease_ttl_s", "", &Config::peer_lease_ttl_s, LeaseSeconds,
             "an integer in [2, 3600]"),
      KeyString("metrics_listen", "--metrics-listen", &Config::metrics_listen),
      KeyBool("metrics_allow_remote", "--metrics-allow-remote",
              &Config::metrics_allow_remote),
      // The compile service (DESIGN §13; config_compile.cc).
      KeyInt("max_parallel_compiles", "", &Config::max_parallel_compiles,
             ParallelCompiles,
             "a whole number from 0 (half the cores) to 100000"),
      KeyInt("compile_cpu_s", "", &Config::compile_cpu_s, CompileCount,
             "a whole number from 1 to 100000"),
      KeyFloat("compile_timeout_s", "", &Config::compile_timeout_s, UpToADay,
               "a number of seconds > 0 and at most 86400"),
      KeyInt("compile_memory_bytes", "", &Config::compile_memory_bytes,
             AtLeastMiB, "a number of bytes of at least 1048576 (1 MiB)"),
      KeyInt("compile_output_bytes", "", &Config::compile_output_bytes,
             AtLeastMiB, "a number of bytes of at least 1048576 (1 MiB)"),
      KeyInt("compile_max_processes", "", &Config::compile_max_processes,
             CompileCount, "a whole number from 1 to 100000"),
      KeyInt("compile_max_running_per_uid", "",
             &Config::compile_max_running_per_uid, CompileCount,
             "a whole number from 1 to 100000"),
      KeyInt("compile_max_queued", "", &Config::compile_max_queued,
             CompileCount, "a whole number from 1 to 100000"),
      KeyInt("compile_max_queued_per_uid", "",
             &Config::compile_max_queued_per_uid, CompileCount,
             "a whole number from 1 to 100000"),
      KeyInt("compile_max_queued_bytes", "", &Config::compile_max_queued_bytes,
             AtLeastMiB, "a number of bytes of at least 1048576 (1 MiB)"),
      KeyInt("compile_max_queued_bytes_per_uid", "",
             &Config::compile_max_queued_bytes_per_uid, AtLeastMiB,
             "a number of bytes of at least 1048576 (1 MiB)"),
      KeyInt("compile_cache_bytes", "", &Config::compile_cache_bytes,
             NotNegativeInt, "a number of bytes >= 0 (0: unbounded)"),
      KeyCustom("compile_cxx", "", &Config::compile_cxx, "an absolute path",
                AbsolutePathToml<&Config::compile_cxx>, nullptr),
      KeyCustom("compile_nvcc", "", &Config::compile_nvcc, "an absolute path",
                AbsolutePathToml<&Config::compile_nvcc>, nullptr),
      KeyCustom("compile_ffi_include_dir", "", &Config::compile_ffi_include_dir,
                "an absolute path",
                AbsolutePathToml<&Config::compile_ffi_include_dir>, nullptr),
      KeyCustom("compile_binary", "", &Config::compile_binary,
                "an absolute path", AbsolutePathToml<&Config::compile_binary>,
                nullptr),
  };
  return *keys;
}

namespace {

// A key's value as a TOML literal (also valid JSON).
std::string FieldToml(const Config& c, const Field& field) {
  return std::visit(
      Overloaded{
          [&](std::string Config::*f) { return TomlString(c.*f); },
          [&](bool Config::*f) { return TomlBool(c.*f); },
          [&](int Config::*f) { return TomlInt(c.*f); },
          [&](int64_t Config::*f) { return TomlInt(c.*f); },
          [&](uint64_t Config::*f) {
            return TomlInt(static_cast<int64_t>(c.*f));
          },
          [&](double Config::*f) { return TomlFloat(c.*f); },
          [&](std::vector<std::string> Config::*f) {
            return TomlStrings(c.*f);
          },
      },
      field);
}

// Reads `value` into the key's field by the generic rules. False when the
// value is refused (the message says the key "must be" k.must_be).
bool ReadField(const KeySpec& k, const toml::node& value, Config* c) {
  return std::visit(
      Overloaded{
          [&](std::string Config::*f) {
            auto s = value.value<std::string>();
            if (s) c->*f = *s;
            return s.has_value();
          },
          [&](bool Config::*f) {
            auto b = value.value<bool>();
            if (b) c->*f = *b;
            return b.has_value();
          },
          [&](double Config::*f) {
            auto d = value.value<double>();
            if (!d || !k.float_ok(*d)) return false;
            c->*f = *d;
            return true;
          },
          [&](std::vector<std::string> Config::*f) {
            const toml::array* a = value.as_array();
            if (a == nullptr) return false;
            for (const auto& e : *a) {
              auto s = e.value<std::string>();
              if (!s) return false;
              (c->*f).push_back(*s);
            }
            return true;
          },
          [&](auto f) {  // int, int64_t, uint64_t
            auto n = value.value<int64_t>();
            if (!n || !k.int_ok(*n)) return false;
            c->*f = static_cast<std::remove_reference_t<decltype(c->*f)>>(*n);
            return true;
          },
      },
      k.field);
}

// The keys, comma-separated, for the unknown-key message.
std::string KnownKeys() {
  std::string out;
  for (const KeySpec& k : Keys()) {
    if (!out.empty()) out += ", ";
    out += k.name;
  }
  return out;
}

std::string UnknownKeyText(const std::string& path, const std::string& key) {
  std::string best;
  size_t best_distance = 3;  // a suggestion only within 2 edits
  for (const KeySpec& known : Keys()) {
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

const KeySpec* FindKey(const std::string& name) {
  for (const KeySpec& k : Keys()) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

// The line `line` (1-based) of the file at `path`; empty when there is none.
std::string LineOf(const std::string& path, size_t line) {
  std::ifstream in(path);
  std::string text;
  for (size_t i = 0; i < line && std::getline(in, text); ++i) {
  }
  return in ? text : std::string();
}

// A TOML syntax error, with the key of its line when the line has one
// (`key = value`) and, where the value is bare text, that strings need
// quotes: toml++'s own text names no key.
std::string ParseErrorText(const std::string& path,
                           const std::string& description, size_t line) {
  std::string text =
      absl::StrCat("config file ", path, ": ", description, " at line ", line);
  const std::string source = LineOf(path, line);
  const size_t eq = source.find('=');
  if (eq == std::string::npos) return text;
  std::string key(absl::StripAsciiWhitespace(source.substr(0, eq)));
  std::string value(absl::StripAsciiWhitespace(source.substr(eq + 1)));
  if (key.empty() || FindKey(key) == nullptr) return text;
  absl::StrAppend(&text, " (the value of key \"", key, "\"");
  if (!value.empty() && std::isalpha(static_cast<unsigned char>(value[0])) &&
      value != "true" && value != "false") {
    absl::StrAppend(&text, ": a string needs quotes, e.g. ", key, " = \"",
                    value, "\"");
  }
  absl::StrAppend(&text, ")");
  return text;
}

}  // namespace

absl::Status ApplyToml(const std::string& path, Config* c) {
  toml::table t;
  if (::access(path.c_str(), R_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config file ", path, " cannot be read: ", strerror(errno)));
  }
  try {
    t = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    return absl::InvalidArgumentError(ParseErrorText(
        path, std::string(e.description()), e.source().begin.line));
  }
  for (const auto& [key, value] : t) {
    std::string k(std::string(key.str()));
    const KeySpec* spec = FindKey(k);
    if (spec == nullptr) {
      return absl::InvalidArgumentError(UnknownKeyText(path, k));
    }
    std::string must_be = spec->must_be;
    if (spec->custom != nullptr ? !spec->custom(value, c, &must_be)
                                : !ReadField(*spec, value, c)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config file ", path, ": key \"", k, "\" must be ", must_be));
    }
    c->origins[k] = path;
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ParseOnOff(const std::string& value,
                                const std::string& from) {
  std::string v = value;
  for (char& ch : v) ch = static_cast<char>(std::tolower(ch));
  if (v == "on" || v == "true" || v == "1") return true;
  if (v == "off" || v == "false" || v == "0") return false;
  return absl::InvalidArgumentError(absl::StrCat(
      from, " is \"", value, "\"; use on or off (also true/false, 1/0)"));
}

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

}  // namespace config_internal

std::vector<ConfigEntry> DescribeConfig(const Config& c) {
  std::vector<ConfigEntry> out;
  for (const config_internal::KeySpec& k : config_internal::Keys()) {
    auto origin = c.origins.find(k.name);
    out.push_back({k.name, config_internal::FieldToml(c, k.field),
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

}  // namespace kreg
