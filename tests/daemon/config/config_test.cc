// ParseConfig: every key read from the config file and from its flag, and
// the messages of bad values (docs/errors.md, docs/kregd.toml.example).
#include "daemon/config/config.h"

#include <grp.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "tests/testing/temp_dir.h"

namespace kreg {
namespace {

using kreg::testing::TempDir;

// ParseConfig over `args` (without argv[0]); the environment variables
// that ParseConfig also reads are cleared first.
absl::StatusOr<Config> Parse(std::vector<std::string> args) {
  ::unsetenv("KREGD_LAUNCH_RING");
  ::unsetenv("KREGD_RING_SPIN_US");
  args.insert(args.begin(), "kregd");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  bool exit_now = true;
  absl::StatusOr<Config> c =
      ParseConfig(static_cast<int>(argv.size()), argv.data(), &exit_now);
  CHECK_FALSE(exit_now);
  return c;
}

// Writes `text` to a config file in `dir`; returns its path.
std::string ConfigFile(const TempDir& dir, const std::string& text) {
  std::string path = dir.path() + "/kregd.toml";
  std::ofstream(path) << text;
  return path;
}

// `key`'s value (as a TOML literal) and origin in the effective config.
ConfigEntry Entry(const Config& c, const std::string& key) {
  for (const ConfigEntry& e : DescribeConfig(c)) {
    if (e.key == key) return e;
  }
  FAIL("no key " << key);
  return {};
}

std::string Resolved(const std::string& path) {
  char buf[PATH_MAX];
  REQUIRE(::realpath(path.c_str(), buf) != nullptr);
  return buf;
}

std::string OwnGroup() {
  const ::group* g = ::getgrgid(::getgid());
  REQUIRE(g != nullptr);
  return g->gr_name;
}

// One key set in the config file: the lines written (the key's, plus any
// key it needs) and the value the effective config then has.
struct FileCase {
  std::string key;
  std::string lines;
  std::string want;
};

std::vector<FileCase> FileCases(const std::string& dir) {
  const std::string group = OwnGroup();
  return {
      {"socket", "socket = \"/tmp/k.sock\"", "\"/tmp/k.sock\""},
      {"state_dir", "state_dir = \"/tmp/st\"", "\"/tmp/st\""},
      {"allowed_roots", absl::StrCat("allowed_roots = [\"", dir, "\"]"),
       absl::StrCat("[\"", Resolved(dir), "\"]")},
      {"max_module_bytes", "max_module_bytes = 1000", "1000"},
      {"max_arena_bytes", "max_arena_bytes = 2000", "2000"},
      {"max_states_per_session", "max_states_per_session = 7", "7"},
      {"max_buffered_bytes", "max_buffered_bytes = 3000", "3000"},
      {"socket_group", absl::StrCat("socket_group = \"", group, "\""),
       absl::StrCat("\"", group, "\"")},
      {"allow_insecure_dirs", "allow_insecure_dirs = true", "true"},
      {"log_level", "log_level = \"debug\"", "\"debug\""},
      {"probe_binary", "probe_binary = \"/x/probe\"", "\"/x/probe\""},
      {"isolation", "isolation = \"UID\"", "\"uid\""},
      {"local_execution", "local_execution = \"Deny\"", "\"deny\""},
      {"replace", "replace = \"Owner\"", "\"owner\""},
      {"replace_timeout", "replace_timeout = 30", "30"},
      {"max_generations_per_target", "max_generations_per_target = 3", "3"},
      {"max_local_module_memory_bytes", "max_local_module_memory_bytes = 4000",
       "4000"},
      {"executor_binary", "executor_binary = \"/x/exec\"", "\"/x/exec\""},
      {"launch_timeout", "launch_timeout = 2.5", "2.5"},
      {"quarantine_crashes", "quarantine_crashes = 5", "5"},
      {"quarantine_window_s", "quarantine_window_s = 60", "60"},
      {"executor_idle_s", "executor_idle_s = 7", "7"},
      {"orphan_timeout", "orphan_timeout = 100", "100"},
      {"seccomp", "seccomp = false", "false"},
      {"max_sessions", "max_sessions = 99", "99"},
      {"max_sessions_per_uid", "max_sessions_per_uid = 9", "9"},
      {"hello_timeout_s", "hello_timeout_s = 3", "3.0"},
      {"probe_timeout_s", "probe_timeout_s = 60", "60.0"},
      {"max_grpc_connections", "max_grpc_connections = 100", "100"},
      {"max_grpc_connections_per_uid", "max_grpc_connections_per_uid = 5", "5"},
      {"grpc_first_message_timeout_s", "grpc_first_message_timeout_s = 2.5",
       "2.5"},
      {"grpc_stream_timeout_s", "grpc_stream_timeout_s = 60", "60.0"},
      {"max_control_connections_per_uid", "max_control_connections_per_uid = 7",
       "7"},
      {"max_pending_connections_per_uid", "max_pending_connections_per_uid = 6",
       "6"},
      {"max_watch_connections_per_uid", "max_watch_connections_per_uid = 5",
       "5"},
      {"control_idle_timeout_s", "control_idle_timeout_s = 1.5", "1.5"},
      {"max_upload_bytes_per_uid", "max_upload_bytes_per_uid = 5000", "5000"},
      {"max_heavy_work_per_uid", "max_heavy_work_per_uid = 3", "3"},
      {"max_states_per_uid", "max_states_per_uid = 9", "9"},
      {"max_grpc_calls_per_uid", "max_grpc_calls_per_uid = 9", "9"},
      {"max_grpc_streams_per_connection", "max_grpc_streams_per_connection = 4",
       "4"},
      {"grpc_max_threads", "grpc_max_threads = 100", "100"},
      {"launch_ring", "launch_ring = false", "false"},
      {"ring_spin_us", "ring_spin_us = 10", "10"},
      {"max_registrations_per_uid", "max_registrations_per_uid = 11", "11"},
      {"max_store_bytes_per_uid", "max_store_bytes_per_uid = 12345", "12345"},
      {"etcd_endpoints",
       "etcd_endpoints = [\"http://127.0.0.1:2379\"]\n"
       "cluster_insecure = true\ncluster_key_file = \"/k\"\n"
       "advertise = \"10.0.0.5:7000\"",
       "[\"http://127.0.0.1:2379\"]"},
      // One comma-separated string is also accepted.
      {"etcd_endpoints",
       "etcd_endpoints = \"http://127.0.0.1:2379,http://127.0.0.2:2379\"\n"
       "cluster_insecure = true\ncluster_key_file = \"/k\"\n"
       "advertise = \"10.0.0.5:7000\"",
       "[\"http://127.0.0.1:2379\", \"http://127.0.0.2:2379\"]"},
      {"cluster", "cluster = \"blue\"", "\"blue\""},
      {"advertise", "advertise = \"10.0.0.5:7000\"", "\"10.0.0.5:7000\""},
      {"peer_listen", "peer_listen = \"10.0.0.5:7001\"", "\"10.0.0.5:7001\""},
      {"host_name", "host_name = \"h1\"", "\"h1\""},
      {"peer_tls_ca", "peer_tls_ca = \"/ca.pem\"", "\"/ca.pem\""},
      {"peer_tls_cert", "peer_tls_cert = \"/cert.pem\"", "\"/cert.pem\""},
      {"peer_tls_key", "peer_tls_key = \"/key.pem\"", "\"/key.pem\""},
      {"cluster_key_file", "cluster_key_file = \"/k\"", "\"/k\""},
      {"cluster_insecure", "cluster_insecure = true", "true"},
      {"etcd_timeout_s", "etcd_timeout_s = 7.5", "7.5"},
      {"peer_lease_ttl_s", "peer_lease_ttl_s = 20", "20"},
      {"metrics_listen", "metrics_listen = \"127.0.0.1:9100\"",
       "\"127.0.0.1:9100\""},
      {"metrics_allow_remote", "metrics_allow_remote = true", "true"},
      {"max_parallel_compiles", "max_parallel_compiles = 3", "3"},
      {"compile_cpu_s", "compile_cpu_s = 30", "30"},
      {"compile_timeout_s", "compile_timeout_s = 90.5", "90.5"},
      {"compile_memory_bytes", "compile_memory_bytes = 2097152", "2097152"},
      {"compile_output_bytes", "compile_output_bytes = 1048576", "1048576"},
      {"compile_max_processes", "compile_max_processes = 8", "8"},
      {"compile_max_running_per_uid", "compile_max_running_per_uid = 3", "3"},
      {"compile_max_queued", "compile_max_queued = 5", "5"},
      {"compile_max_queued_per_uid", "compile_max_queued_per_uid = 4", "4"},
      {"compile_max_queued_bytes", "compile_max_queued_bytes = 2097152",
       "2097152"},
      {"compile_max_queued_bytes_per_uid",
       "compile_max_queued_bytes_per_uid = 1048576", "1048576"},
      {"compile_cache_bytes", "compile_cache_bytes = 0", "0"},
      {"compile_cxx", "compile_cxx = \"/usr/bin/c++\"", "\"/usr/bin/c++\""},
      {"compile_nvcc", "compile_nvcc = \"/opt/nvcc\"", "\"/opt/nvcc\""},
      {"compile_ffi_include_dir", "compile_ffi_include_dir = \"/inc\"",
       "\"/inc\""},
      {"compile_binary", "compile_binary = \"/bin/kc\"", "\"/bin/kc\""},
  };
}

TEST_CASE("Every key parses from the config file", "[config]") {
  TempDir dir;
  std::set<std::string> tested;
  const std::vector<FileCase> cases = FileCases(dir.path());
  for (size_t i = 0; i < cases.size(); ++i) {
    const FileCase& t = cases[i];
    // Named by row: the lines hold the temporary directory, new each run.
    DYNAMIC_SECTION("row " << i << ": " << t.key) {
      const std::string path = ConfigFile(dir, t.lines + "\n");
      absl::StatusOr<Config> c = Parse({"--config", path});
      REQUIRE(c.ok());
      ConfigEntry e = Entry(*c, t.key);
      CHECK(e.value_toml == t.want);
      CHECK(e.origin == path);
    }
    tested.insert(t.key);
  }
  // A new key needs a row above.
  for (const ConfigEntry& e : DescribeConfig(Config{})) {
    CHECK(tested.count(e.key) == 1);
  }
}

// A flag: its arguments, the key it sets and the value the effective
// config then has. The key's origin is the flag.
struct FlagCase {
  std::vector<std::string> args;
  std::string key;
  std::string want;
};

TEST_CASE("Every flag sets its key, over the config file", "[config]") {
  TempDir dir;
  const std::vector<FlagCase> cases = {
      {{"--socket", "/tmp/f.sock"}, "socket", "\"/tmp/f.sock\""},
      {{"--state-dir", "/tmp/fst"}, "state_dir", "\"/tmp/fst\""},
      {{"--max-module-bytes", "77"}, "max_module_bytes", "77"},
      {{"--log-level", "warn"}, "log_level", "\"warn\""},
      {{"--isolation", "Shared"}, "isolation", "\"shared\""},
      {{"--local-execution", "deny"}, "local_execution", "\"deny\""},
      {{"--replace", "OWNER"}, "replace", "\"owner\""},
      {{"--replace-timeout", "2"}, "replace_timeout", "2"},
      {{"--executor-binary", "/f/exec"}, "executor_binary", "\"/f/exec\""},
      {{"--launch-timeout", "1.5"}, "launch_timeout", "1.5"},
      {{"--quarantine-crashes", "0"}, "quarantine_crashes", "0"},
      {{"--quarantine-window", "30"}, "quarantine_window_s", "30"},
      {{"--orphan-timeout", "0"}, "orphan_timeout", "0"},
      {{"--launch-ring", "OFF"}, "launch_ring", "false"},
      {{"--ring-spin-us", "0"}, "ring_spin_us", "0"},
      {{"--max-registrations-per-uid", "5"}, "max_registrations_per_uid", "5"},
      {{"--max-store-bytes-per-uid", "6"}, "max_store_bytes_per_uid", "6"},
      {{"--etcd-endpoints", "http://127.0.0.1:2379,", "--advertise",
        "10.0.0.5:7000", "--cluster-insecure", "--cluster-key-file", "/k"},
       "etcd_endpoints",
       "[\"http://127.0.0.1:2379\"]"},
      {{"--cluster", "green"}, "cluster", "\"green\""},
      {{"--advertise", "10.0.0.6:7000"}, "advertise", "\"10.0.0.6:7000\""},
      {{"--peer-listen", "10.0.0.6:7001"}, "peer_listen", "\"10.0.0.6:7001\""},
      {{"--host-name", "h2"}, "host_name", "\"h2\""},
      {{"--peer-tls-ca", "/f/ca"}, "peer_tls_ca", "\"/f/ca\""},
      {{"--peer-tls-cert", "/f/cert"}, "peer_tls_cert", "\"/f/cert\""},
      {{"--peer-tls-key", "/f/key"}, "peer_tls_key", "\"/f/key\""},
      {{"--cluster-key-file", "/f/k"}, "cluster_key_file", "\"/f/k\""},
      {{"--cluster-insecure"}, "cluster_insecure", "true"},
      {{"--metrics-listen", "unix:/tmp/f.sock"},
       "metrics_listen",
       "\"unix:/tmp/f.sock\""},
      {{"--metrics-allow-remote"}, "metrics_allow_remote", "true"},
      {{"--allow-insecure-dirs"}, "allow_insecure_dirs", "true"},
  };
  for (const FlagCase& t : cases) {
    DYNAMIC_SECTION(t.args[0]) {
      absl::StatusOr<Config> c = Parse(t.args);
      REQUIRE(c.ok());
      ConfigEntry e = Entry(*c, t.key);
      CHECK(e.value_toml == t.want);
      CHECK(e.origin == t.args[0]);
    }
  }
  SECTION("a flag wins over the file; --allow-root adds to its roots") {
    const std::string a = dir.path() + "/a", b = dir.path() + "/b";
    REQUIRE(::mkdir(a.c_str(), 0700) == 0);
    REQUIRE(::mkdir(b.c_str(), 0700) == 0);
    const std::string path = ConfigFile(
        dir, absl::StrCat("log_level = \"debug\"\nallowed_roots = [\"", a,
                          "\"]\nmax_sessions = 5\n"));
    absl::StatusOr<Config> c =
        Parse({"--config", path, "--log-level", "error", "--allow-root", b});
    REQUIRE(c.ok());
    CHECK(Entry(*c, "log_level").value_toml == "\"error\"");
    CHECK(Entry(*c, "log_level").origin == "--log-level");
    CHECK(Entry(*c, "allowed_roots").value_toml ==
          absl::StrCat("[\"", Resolved(a), "\", \"", Resolved(b), "\"]"));
    CHECK(Entry(*c, "allowed_roots").origin ==
          absl::StrCat(path, ", --allow-root"));
    CHECK(Entry(*c, "max_sessions").origin == path);
    CHECK(Entry(*c, "cluster").origin == "default");
  }
  SECTION("a flag below its range leaves the key alone") {
    absl::StatusOr<Config> c =
        Parse({"--max-module-bytes", "0", "--launch-timeout", "-1"});
    REQUIRE(c.ok());
    CHECK(Entry(*c, "max_module_bytes").value_toml == "536870912");
    CHECK(Entry(*c, "launch_timeout").value_toml == "0.0");
  }
}

// A bad config file line and the message (after "config file PATH: ").
struct BadFileCase {
  std::string line;
  std::string message;
};

TEST_CASE("Bad values in the config file name the key and what it must be",
          "[config]") {
  TempDir dir;
  const std::vector<BadFileCase> cases = {
      {"socket = 3", "key \"socket\" must be a string"},
      {"seccomp = \"yes\"", "key \"seccomp\" must be true or false"},
      {"launch_ring = \"on\"", "key \"launch_ring\" must be true or false"},
      {"allowed_roots = \"/x\"",
       "key \"allowed_roots\" must be an array of directory paths"},
      {"allowed_roots = [1]",
       "key \"allowed_roots\" must be an array of directory paths"},
      {"max_module_bytes = 0",
       "key \"max_module_bytes\" must be a positive integer"},
      {"max_store_bytes_per_uid = -1",
       "key \"max_store_bytes_per_uid\" must be a positive integer"},
      {"quarantine_crashes = -1",
       "key \"quarantine_crashes\" must be a non-negative integer"},
      {"max_sessions = 3000000000",
       "key \"max_sessions\" must be a non-negative integer"},
      {"orphan_timeout = 86401",
       "key \"orphan_timeout\" must be a whole number of seconds from 0 to "
       "86400 (0: executors stop with kregd)"},
      {"replace_timeout = 0",
       "key \"replace_timeout\" must be a whole number of seconds from 1 to "
       "60"},
      {"replace_timeout = 61",
       "key \"replace_timeout\" must be a whole number of seconds from 1 to "
       "60"},
      {"max_generations_per_target = 1",
       "key \"max_generations_per_target\" must be a whole number from 2 to "
       "1024"},
      {"max_generations_per_target = 1025",
       "key \"max_generations_per_target\" must be a whole number from 2 to "
       "1024"},
      {"launch_timeout = -1.0",
       "key \"launch_timeout\" must be a number of seconds >= 0 (0: off)"},
      {"hello_timeout_s = 0",
       "key \"hello_timeout_s\" must be a number of seconds > 0 and at most "
       "86400"},
      {"probe_timeout_s = -5",
       "key \"probe_timeout_s\" must be a number of seconds > 0 and at most "
       "86400"},
      {"probe_timeout_s = 3000000",
       "key \"probe_timeout_s\" must be a number of seconds > 0 and at most "
       "86400"},
      {"max_grpc_connections = 0",
       "key \"max_grpc_connections\" must be a whole number from 1 to "
       "1000000"},
      {"max_grpc_connections_per_uid = 3000000000",
       "key \"max_grpc_connections_per_uid\" must be a whole number from 1 to "
       "1000000"},
      {"grpc_first_message_timeout_s = 0",
       "key \"grpc_first_message_timeout_s\" must be a number of seconds > 0 "
       "and at most 86400"},
      {"grpc_stream_timeout_s = 86401",
       "key \"grpc_stream_timeout_s\" must be a number of seconds > 0 and at "
       "most 86400"},
      {"max_control_connections_per_uid = 0",
       "key \"max_control_connections_per_uid\" must be a whole number from "
       "1 to 1000000"},
      {"max_pending_connections_per_uid = 0",
       "key \"max_pending_connections_per_uid\" must be a whole number from "
       "1 to 1000000"},
      {"max_watch_connections_per_uid = 0",
       "key \"max_watch_connections_per_uid\" must be a whole number from "
       "1 to 1000000"},
      {"control_idle_timeout_s = 0",
       "key \"control_idle_timeout_s\" must be a number of seconds > 0 and "
       "at most 86400"},
      {"max_upload_bytes_per_uid = -1",
       "key \"max_upload_bytes_per_uid\" must be a non-negative integer (0: "
       "twice max_module_bytes)"},
      {"max_states_per_uid = 0",
       "key \"max_states_per_uid\" must be a whole number from 1 to "
       "1000000"},
      {"max_states_per_session = 0",
       "key \"max_states_per_session\" must be a positive integer"},
      {"max_heavy_work_per_uid = 0",
       "key \"max_heavy_work_per_uid\" must be a whole number from 1 to "
       "1000000"},
      {"max_grpc_calls_per_uid = 0",
       "key \"max_grpc_calls_per_uid\" must be a whole number from 1 to "
       "1000000"},
      {"max_grpc_streams_per_connection = 0",
       "key \"max_grpc_streams_per_connection\" must be a whole number from "
       "1 to 1000000"},
      {"grpc_max_threads = 2",
       "key \"grpc_max_threads\" must be a whole number from 8 to 100000"},
      {"ring_spin_us = 2000000",
       "key \"ring_spin_us\" must be a whole number of microseconds from 0 "
       "to 1000000, not 2000000"},
      {"ring_spin_us = \"x\"",
       "key \"ring_spin_us\" must be a whole number of microseconds from 0 "
       "to 1000000, not a number"},
      {"etcd_endpoints = 5",
       "key \"etcd_endpoints\" must be an array of URLs (or one "
       "comma-separated string)"},
      {"etcd_endpoints = [5]",
       "key \"etcd_endpoints\" must be an array of URLs"},
      {"etcd_timeout_s = 601",
       "key \"etcd_timeout_s\" must be a number of seconds in (0, 600]"},
      {"peer_lease_ttl_s = 1",
       "key \"peer_lease_ttl_s\" must be an integer in [2, 3600]"},
      {"max_parallel_compiles = -1",
       "key \"max_parallel_compiles\" must be a whole number from 0 (half "
       "the cores) to 100000"},
      {"compile_max_queued_per_uid = 0",
       "key \"compile_max_queued_per_uid\" must be a whole number from 1 to "
       "100000"},
      {"compile_max_queued_bytes = 1000",
       "key \"compile_max_queued_bytes\" must be a number of bytes of at "
       "least 1048576 (1 MiB)"},
      {"compile_cpu_s = 0",
       "key \"compile_cpu_s\" must be a whole number from 1 to 100000"},
      {"compile_timeout_s = 86401",
       "key \"compile_timeout_s\" must be a number of seconds > 0 and at most "
       "86400"},
      {"compile_memory_bytes = 1000",
       "key \"compile_memory_bytes\" must be a number of bytes of at least "
       "1048576 (1 MiB)"},
      {"compile_cache_bytes = -1",
       "key \"compile_cache_bytes\" must be a number of bytes >= 0 (0: "
       "unbounded)"},
      {"compile_cxx = \"g++\"", "key \"compile_cxx\" must be an absolute path"},
      {"compile_nvcc = 5", "key \"compile_nvcc\" must be an absolute path"},
      {"isolaton = \"uid\"",
       "unknown key \"isolaton\" (did you mean \"isolation\"? known: socket, "
       "state_dir, "},
  };
  for (const BadFileCase& t : cases) {
    DYNAMIC_SECTION(t.line) {
      const std::string path = ConfigFile(dir, t.line + "\n");
      absl::StatusOr<Config> c = Parse({"--config", path});
      REQUIRE_FALSE(c.ok());
      CHECK(c.status().code() == absl::StatusCode::kInvalidArgument);
      const std::string want = absl::StrCat("config file ", path, ": ");
      CHECK(std::string(c.status().message()).rfind(want + t.message, 0) == 0);
    }
  }
}

TEST_CASE("A TOML syntax error names the key of its line", "[config]") {
  TempDir dir;
  const std::vector<BadFileCase> cases = {
      {"log_level = debug",
       "Error while parsing value: could not determine value type at line 2 "
       "(the value of key \"log_level\": a string needs quotes, e.g. "
       "log_level = \"debug\")"},
      {"max_module_bytes = 12x",
       "Error while parsing decimal integer: expected digit, saw 'x' at line "
       "2 (the value of key \"max_module_bytes\")"},
      // No key on the line: toml++'s text as it is.
      {"[broken", "Error while parsing table header: "},
  };
  for (const BadFileCase& t : cases) {
    DYNAMIC_SECTION(t.line) {
      const std::string path =
          ConfigFile(dir, "isolation = \"uid\"\n" + t.line + "\n");
      absl::StatusOr<Config> c = Parse({"--config", path});
      REQUIRE_FALSE(c.ok());
      CHECK(c.status().code() == absl::StatusCode::kInvalidArgument);
      CHECK_THAT(std::string(c.status().message()),
                 Catch::StartsWith(
                     absl::StrCat("config file ", path, ": ", t.message)));
    }
  }
}

// Bad values checked once file and flags are merged, and bad flags.
struct BadCase {
  std::vector<std::string> args;
  std::string message;
};

TEST_CASE("Bad flags and merged values give the documented messages",
          "[config]") {
  const std::vector<BadCase> cases = {
      {{"--launch-ring", "maybe"},
       "--launch-ring is \"maybe\"; use on or off (also true/false, 1/0)"},
      {{"--ring-spin-us", "x"},
       "--ring-spin-us is \"x\"; use a whole number of microseconds from 0 "
       "(sleep at once) to 1000000"},
      {{"--log-level", "loud"},
       "unknown log level \"loud\" (--log-level); use one of trace, debug, "
       "info, warn, error, critical, off"},
      {{"--isolation", "bogus"},
       "isolation \"bogus\" is not one of uid, client, shared (see --help)"},
      {{"--local-execution", "maybe"},
       "local_execution \"maybe\" (--local-execution) is not one of allow, "
       "deny"},
      {{"--replace", "maybe"},
       "replace \"maybe\" (--replace) is not one of deny, owner "
       "(docs/replace.md)"},
      {{"--allow-root", "/nonexistent/kreg-root"},
       "allowed root \"/nonexistent/kreg-root\" does not exist or cannot be "
       "resolved"},
      {{"--etcd-endpoints", "http://127.0.0.1:2379", "--cluster-insecure"},
       "cluster mode (--etcd-endpoints) needs --advertise HOST:PORT"},
      {{"--etcd-endpoints", "http://127.0.0.2:2379", "--advertise",
        "10.0.0.5:7000"},
       "etcd endpoint \"http://127.0.0.2:2379\" is plaintext: anyone who can "
       "reach it can read and rewrite the cluster's bindings. Use https:// "
       "(etcd with client certificate auth; kregd presents peer_tls_cert), "
       "or set cluster_insecure = true (--cluster-insecure) for a test "
       "cluster"},
      {{"--etcd-endpoints", "https://127.0.0.3:2379", "--advertise",
        "10.0.0.5:7000"},
       "cluster mode (--etcd-endpoints) needs cluster_key_file "
       "(--cluster-key-file): a file with the cluster key"},
      {{"--etcd-endpoints", "https://127.0.0.4:2379", "--advertise",
        "10.0.0.5"},
       "advertise address \"10.0.0.5\" is not HOST:PORT (no :PORT)"},
      {{"--etcd-endpoints", "https://127.0.0.5:2379", "--advertise",
        "10.0.0.5:7000", "--peer-listen", "[::1]7001"},
       "peer_listen address \"[::1]7001\" is not HOST:PORT (expected "
       "[IPv6]:PORT)"},
      {{"--etcd-endpoints", "https://127.0.0.6:2379/v3"},
       "etcd endpoint \"https://127.0.0.6:2379/v3\" is not HOST:PORT (port "
       "\"2379/v3\" is not a number from 1 to 65535; e.g. "
       "http://10.0.0.5:2379)"},
      {{"--config", "/nonexistent/kregd.toml"},
       "config file /nonexistent/kregd.toml cannot be read: "},
  };
  for (const BadCase& t : cases) {
    DYNAMIC_SECTION(t.args[0] << " " << t.args[1]) {
      absl::StatusOr<Config> c = Parse(t.args);
      REQUIRE_FALSE(c.ok());
      CHECK(c.status().code() == absl::StatusCode::kInvalidArgument);
      CHECK(std::string(c.status().message()).rfind(t.message, 0) == 0);
    }
  }
  SECTION("a value CLI11 refuses points at --help") {
    absl::StatusOr<Config> c = Parse({"--orphan-timeout", "99999"});
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == absl::StatusCode::kInvalidArgument);
    const std::string m(c.status().message());
    CHECK(m.find("--orphan-timeout") != std::string::npos);
    CHECK(m.find("; run kregd --help for the flags") != std::string::npos);
  }
}

TEST_CASE("replace is deny by default; a bad value in the file says so",
          "[config][replace]") {
  absl::StatusOr<Config> plain = Parse({});
  REQUIRE(plain.ok());
  CHECK(plain->replace == "deny");
  TempDir dir;
  absl::StatusOr<Config> c =
      Parse({"--config", ConfigFile(dir, "replace = \"anyone\"\n")});
  REQUIRE(c.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(c.status().message()) ==
        "replace \"anyone\" (config file) is not one of deny, owner "
        "(docs/replace.md)");
}

}  // namespace
}  // namespace kreg
