#include "daemon/config/config.h"

#include <grp.h>
#include <limits.h>
#include <stdlib.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/paths.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "daemon/config/config_keys.h"
#include "daemon/metrics/listen_address.h"

namespace kreg {
namespace {

using config_internal::ApplyToml;
using config_internal::Field;
using config_internal::Keys;
using config_internal::KeySpec;
using config_internal::Overloaded;
using config_internal::ParseOnOff;
using config_internal::ParseSpinUs;

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

// The command line's values. Each typed flag is bound to its key's field
// in `values`, which starts "unset" (UnsetFlagFields) so that a flag not
// given, or given a value below its range (--launch-timeout -1,
// --max-module-bytes 0), leaves the key alone; the flags a TextFlag
// converts are bound to `texts`, by flag name.
struct FlagValues {
  std::string config_file;
  Config values;
  std::map<std::string, std::string> texts;
};

void UnsetFlagFields(Config* c) {
  for (const KeySpec& k : Keys()) {
    if (k.flag[0] == '\0') continue;
    std::visit(
        Overloaded{
            [&](std::string Config::*f) { (c->*f).clear(); },
            [&](bool Config::*f) { c->*f = false; },
            [&](uint64_t Config::*f) { c->*f = 0; },
            [&](std::vector<std::string> Config::*f) { (c->*f).clear(); },
            [&](auto f) { c->*f = -1; },  // int, int64_t, double
        },
        k.field);
  }
}

// Copies a typed flag's value to `c` when it was set (see FlagValues); a
// list flag adds to the list (--allow-root to the file's roots).
void CopyFlagField(const Config& flags, const Field& field, Config* c) {
  std::visit(Overloaded{
                 [&](std::string Config::*f) {
                   if (!(flags.*f).empty()) c->*f = flags.*f;
                 },
                 [&](bool Config::*f) {
                   if (flags.*f) c->*f = true;
                 },
                 [&](uint64_t Config::*f) {
                   if (flags.*f != 0) c->*f = flags.*f;
                 },
                 [&](std::vector<std::string> Config::*f) {
                   (c->*f).insert((c->*f).end(), (flags.*f).begin(),
                                  (flags.*f).end());
                 },
                 [&](auto f) {  // int, int64_t, double
                   if (flags.*f >= 0) c->*f = flags.*f;
                 },
             },
             field);
}

// The flags of the daemon and its executors, in the order of --help.
void AddFlags(CLI::App* app, FlagValues* f) {
  Config& v = f->values;
  app->add_option("--config", f->config_file, "TOML config file");
  app->add_option("--socket", v.socket_path, "gRPC Unix socket path")
      ->default_str(DefaultSocketPath());
  app->add_option("--state-dir", v.state_dir, "journal and module store")
      ->default_str(DefaultStateDir());
  app->add_option("--allow-root", v.allowed_roots,
                  "directory the daemon may read module paths from "
                  "(repeatable)");
  app->add_option("--max-module-bytes", v.max_module_bytes,
                  "largest module accepted");
  app->add_option("--socket-group", v.socket_group,
                  "group that owns the sockets when kregd binds them "
                  "(default: kregd's own)");
  app->add_option("--max-registrations-per-uid", v.max_registrations_per_uid,
                  "registrations one uid may hold (root exempt)")
      ->default_str("1024");
  app->add_option("--max-store-bytes-per-uid", v.max_store_bytes_per_uid,
                  "module store bytes one uid's registrations may reference "
                  "(root exempt)")
      ->default_str("4294967296");
  app->add_option("--log-level", v.log_level,
                  "trace|debug|info|warn|error|critical|off");
  app->set_version_flag("--version", absl::StrCat("kregd ", kKregVersion));
  app->add_option("--isolation", v.isolation,
                  "executor grouping: client (default), uid or shared");
  app->add_option("--local-execution", v.local_execution,
                  "allow (default) or deny: whether clients may run "
                  "registered kernels in their own process");
  app->add_option("--replace", v.replace,
                  "deny (default) or owner: whether a target's owner or root "
                  "may replace it in place with replace=true");
  app->add_option("--replace-timeout", v.replace_timeout_s,
                  "seconds a replacement waits for the processes that have "
                  "the target bound to switch (default 10)")
      ->check(CLI::Range(int64_t{1}, int64_t{60}));
  app->add_option("--executor-binary", v.executor_binary,
                  "kregd-exec to start (default: next to kregd)");
  app->add_option("--launch-timeout", v.launch_timeout_s,
                  "seconds a handler may run before its executor is killed "
                  "(0: off, the default)");
  app->add_flag("--allow-insecure-dirs", v.allow_insecure_dirs,
                "start (with a warning) even when the socket or state "
                "directory may be written by others than kregd");
  app->add_option("--orphan-timeout", v.orphan_timeout_s,
                  "seconds executors serve their sessions on after kregd "
                  "stops or dies (default 300; 0: they stop with kregd)")
      ->check(CLI::Range(int64_t{0}, int64_t{86400}));
  app->add_option("--quarantine-crashes", v.quarantine_crashes,
                  "crashes within the window that quarantine a target "
                  "(default 3; 0: never)");
  app->add_option("--quarantine-window", v.quarantine_window_s,
                  "the quarantine window in seconds (default 600)");
}

// Cluster mode, metrics and the launch ring, in the order of --help.
void AddMoreFlags(CLI::App* app, FlagValues* f) {
  Config& v = f->values;
  app->add_option("--etcd-endpoints", f->texts["--etcd-endpoints"],
                  "cluster mode: etcd members, URL[,URL...] "
                  "(https://HOST:PORT; http:// only with --cluster-insecure)");
  app->add_option("--cluster", v.cluster,
                  "cluster mode: the cluster's name (default \"default\")");
  app->add_option("--advertise", v.advertise,
                  "cluster mode: HOST:PORT other hosts fetch modules from");
  app->add_option("--peer-listen", v.peer_listen,
                  "cluster mode: HOST:PORT to serve peers on (default: the "
                  "--advertise address)");
  app->add_option("--host-name", v.host_name,
                  "cluster mode: this host's name in messages (default: its "
                  "hostname)");
  app->add_option("--peer-tls-ca", v.peer_tls_ca,
                  "cluster mode: CA certificate (PEM) peers' certificates "
                  "must be signed by");
  app->add_option("--peer-tls-cert", v.peer_tls_cert,
                  "cluster mode: this host's certificate (PEM)");
  app->add_option("--peer-tls-key", v.peer_tls_key,
                  "cluster mode: this host's private key (PEM)");
  app->add_option("--cluster-key-file", v.cluster_key_file,
                  "cluster mode: file with the cluster key (same on every "
                  "host, mode 0600) that signs the bindings in etcd");
  app->add_flag("--cluster-insecure", v.cluster_insecure,
                "cluster mode: allow plaintext http:// etcd endpoints");
  app->add_option("--metrics-listen", v.metrics_listen,
                  "serve Prometheus metrics at http://ADDR/metrics: "
                  "127.0.0.1:PORT, [::1]:PORT or unix:/path (default: off)");
  app->add_flag("--metrics-allow-remote", v.metrics_allow_remote,
                "allow a --metrics-listen address that is not loopback");
  app->add_option("--launch-ring", f->texts["--launch-ring"],
                  "offer clients the shared-memory launch ring for CPU "
                  "launches: on (default) or off");
  app->add_option("--ring-spin-us", f->texts["--ring-spin-us"],
                  "microseconds an executor's ring thread spins for the next "
                  "launch before it sleeps (default 50; 0 to 1000000)");
}

// The flags over the config file, and each given flag as its key's origin
// (--allow-root after the file's path when the file has roots too).
absl::Status ApplyFlags(const CLI::App& app, const FlagValues& f, Config* c) {
  for (const KeySpec& k : Keys()) {
    if (k.flag[0] == '\0') continue;
    if (k.text_flag == nullptr) {
      CopyFlagField(f.values, k.field, c);
    } else if (const std::string& text = f.texts.at(k.flag); !text.empty()) {
      KREG_RETURN_IF_ERROR(k.text_flag(text, k.flag, c));
    }
  }
  for (const KeySpec& k : Keys()) {
    if (k.flag[0] == '\0' || app.count(k.flag) == 0) continue;
    std::string& origin = c->origins[k.name];
    origin =
        std::holds_alternative<std::vector<std::string> Config::*>(k.field) &&
                !origin.empty()
            ? absl::StrCat(origin, ", ", k.flag)
            : k.flag;
  }
  return absl::OkStatus();
}

// The environment variables these keys replaced still work, below the
// config file and the flags.
absl::Status ApplyEnvironment(Config* c) {
  if (const char* env = std::getenv("KREGD_LAUNCH_RING")) {
    KREG_ASSIGN_OR_RETURN(c->launch_ring,
                          ParseOnOff(env, "$KREGD_LAUNCH_RING"));
    c->origins["launch_ring"] = "$KREGD_LAUNCH_RING";
  }
  if (const char* env = std::getenv("KREGD_RING_SPIN_US")) {
    KREG_ASSIGN_OR_RETURN(c->ring_spin_us,
                          ParseSpinUs(env, "$KREGD_RING_SPIN_US"));
    c->origins["ring_spin_us"] = "$KREGD_RING_SPIN_US";
  }
  return absl::OkStatus();
}

// Checks the merged settings whose messages say whether the value came
// from the config file or a flag (`flags`), and normalizes isolation,
// local_execution and replace to lower case.
absl::Status CheckMerged(const Config& flags, Config* c) {
  KREG_RETURN_IF_ERROR(CheckLogLevel(
      c->log_level, flags.log_level.empty() ? "log_level in the config file"
                                            : "--log-level"));
  KREG_RETURN_IF_ERROR(FinishClusterConfig(c));
  if (!c->metrics_listen.empty()) {
    absl::StatusOr<MetricsAddress> address =
        ParseMetricsAddress(c->metrics_listen, c->metrics_allow_remote);
    if (!address.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          address.status().message(), flags.metrics_listen.empty()
                                          ? " (config file)"
                                          : " (--metrics-listen)"));
    }
  }
  std::string iso = absl::AsciiStrToLower(c->isolation);
  if (iso != "uid" && iso != "client" && iso != "shared") {
    return absl::InvalidArgumentError(
        absl::StrCat("isolation \"", c->isolation,
                     "\" is not one of uid, client, shared (see --help)"));
  }
  c->isolation = iso;
  std::string policy = absl::AsciiStrToLower(c->local_execution);
  if (policy != "allow" && policy != "deny") {
    return absl::InvalidArgumentError(absl::StrCat(
        "local_execution \"", c->local_execution, "\" (",
        flags.local_execution.empty() ? "config file" : "--local-execution",
        ") is not one of allow, deny"));
  }
  c->local_execution = policy;
  std::string replace = absl::AsciiStrToLower(c->replace);
  if (replace != "deny" && replace != "owner") {
    return absl::InvalidArgumentError(
        absl::StrCat("replace \"", c->replace, "\" (",
                     flags.replace.empty() ? "config file" : "--replace",
                     ") is not one of deny, owner (docs/replace.md)"));
  }
  c->replace = replace;
  return absl::OkStatus();
}

// Fills the default paths, resolves the allowed roots and checks that
// socket_group exists.
absl::Status ResolvePaths(Config* c) {
  if (c->socket_path.empty()) c->socket_path = DefaultSocketPath();
  if (c->state_dir.empty()) c->state_dir = DefaultStateDir();
  for (std::string& root : c->allowed_roots) {
    char resolved[PATH_MAX];
    if (::realpath(root.c_str(), resolved) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "allowed root \"", root, "\" does not exist or cannot be resolved"));
    }
    root = resolved;
  }
  // The group is resolved here, not when the sockets are bound, so that a
  // typo is a configuration error (exit 2) like every other one.
  if (!c->socket_group.empty()) {
    errno = 0;
    if (::getgrnam(c->socket_group.c_str()) == nullptr) {
      const int err = errno;
      return absl::InvalidArgumentError(
          absl::StrCat("socket_group \"", c->socket_group,
                       "\" (--socket-group or the config file) does not exist",
                       err != 0 && err != ENOENT && err != ESRCH &&
                               err != EBADF && err != EPERM
                           ? absl::StrCat(" or cannot be looked up (",
                                          std::strerror(err), ")")
                           : std::string(),
                       "; give an existing group (getent group NAME), or leave "
                       "socket_group empty for kregd's own group"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Config> ParseConfig(int argc, char** argv, bool* exit_now) {
  *exit_now = false;
  Config c;
  FlagValues flags;
  UnsetFlagFields(&flags.values);
  CLI::App app{
      "kregd: out-of-process kernel registry and executor for JAX's "
      "XLA FFI"};
  AddFlags(&app, &flags);
  AddMoreFlags(&app, &flags);
  bool check = false, print_defaults = false;
  app.add_flag("--check-config", check,
               "validate the flags, environment and --config file, print the "
               "effective configuration and exit (status 2 on an error)");
  app.add_flag("--print-default-config", print_defaults,
               "print the embedded default configuration as a config file and "
               "exit");
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
  absl::Status st = ApplyEnvironment(&c);
  c.config_file = flags.config_file;
  if (st.ok() && !flags.config_file.empty()) {
    st = ApplyToml(flags.config_file, &c);
  }
  if (st.ok()) st = ApplyFlags(app, flags, &c);
  if (st.ok()) st = CheckMerged(flags.values, &c);
  if (st.ok()) st = ResolvePaths(&c);
  if (print_defaults) {
    Config defaults;
    (void)ResolvePaths(&defaults);
    std::cout << ConfigToml(defaults);
    *exit_now = true;
    return defaults;
  }
  if (!st.ok()) return st;
  if (check) {
    std::cout << ConfigToml(c);
    std::cerr << "kregd: the configuration is valid\n";
    *exit_now = true;
  }
  return c;
}

}  // namespace kreg
