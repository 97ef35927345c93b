// kregd's configuration as a value: every setting with its embedded
// default, and the effective configuration described key by key
// (config_keys.cc, whose table names each field's key). config.h reads it
// from the TOML file and the flags.
#ifndef KREGD_DAEMON_CONFIG_CONFIG_FIELDS_H_
#define KREGD_DAEMON_CONFIG_CONFIG_FIELDS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kreg {

struct Config {
  std::string socket_path;  // gRPC; the session socket is <path>.session
  std::string state_dir;    // journal and modules/
  std::vector<std::string> allowed_roots;
  uint64_t max_module_bytes = 512ull << 20;
  uint64_t max_arena_bytes = 4ull << 30;
  // Call-site states of handler bundles one session may hold
  // (docs/kernel-author-guide.md, "Handler bundles and state").
  uint64_t max_states_per_session = 4096;
  // Bytes the receive buffers of one executor's sessions may hold at once.
  uint64_t max_buffered_bytes = 1ull << 30;
  // Per-uid limits of the registry (root is exempt).
  uint64_t max_registrations_per_uid = 1024;
  uint64_t max_store_bytes_per_uid = 4ull << 30;
  std::string socket_group;  // empty: the daemon's group
  // Start even when the socket or state directory may be written by others
  // than kregd (only a warning then).
  bool allow_insecure_dirs = false;
  std::string log_level = "info";
  std::string probe_binary;  // empty: kregd-probe next to kregd
  // Executors (DESIGN §8).
  // One executor per client process by default: handler globals and
  // crashes are per process, as in-process (DESIGN §11).
  std::string isolation = "client";  // client | uid | shared
  // Whether clients may run registered kernels in their own process
  // (DESIGN §11): allow | deny.
  std::string local_execution = "allow";
  // Whether a target's owner (or root) may replace it in place with
  // replace=true (docs/replace.md): deny | owner.
  std::string replace = "deny";
  // Seconds a replacement waits for the live holders to switch
  // (docs/replace.md section 5), 1..60: a replacement returns within the
  // 120 s kregctl gives an RPC, probe included.
  int64_t replace_timeout_s = 10;
  // Live generations a replaced target may have, 2..1024: the current one,
  // the one it replaced, and the earlier ones live processes hold or pin
  // (docs/replace.md section 2). A replacement past it is refused.
  int64_t max_generations_per_target = 8;
  // Bytes of the sealed module memfds kregd keeps for local binds, all
  // modules together (LocalModuleCache).
  uint64_t max_local_module_memory_bytes = 2ull << 30;
  std::string executor_binary;  // empty: kregd-exec next to kregd
  double launch_timeout_s = 0;  // 0: off
  int quarantine_crashes = 3;   // 0: never quarantine
  int64_t quarantine_window_s = 600;
  int64_t executor_idle_s = 30;
  // Executors outlive kregd (DESIGN §12): one serving sessions when kregd
  // stops or dies serves them on until they close, at most this long
  // (seconds); 0: executors stop with kregd.
  int64_t orphan_timeout_s = 300;
  bool seccomp = true;
  int max_sessions = 4096;
  int max_sessions_per_uid = 256;
  double hello_timeout_s = 10;  // a session must say Hello within this
  // Loading and querying a module being registered (kregd-probe) must end
  // within this many seconds, or the registration is refused.
  double probe_timeout_s = 20;
  // The gRPC socket (operator guide, "Limits"): connections held at once,
  // in all and per uid; a connection's first bytes must arrive within
  // grpc_first_message_timeout_s, a RegisterTarget upload must end within
  // grpc_stream_timeout_s.
  int max_grpc_connections = 1024;
  int max_grpc_connections_per_uid = 64;
  double grpc_first_message_timeout_s = 10;
  double grpc_stream_timeout_s = 300;
  // What one uid may hold at once (the per-uid account, DESIGN §14 rule 2;
  // operator guide, "Per-uid limits"): control connections (apart from
  // sessions), and one that holds no registration is closed after
  // control_idle_timeout_s idle; module upload bytes in flight by announced
  // size (0: twice max_module_bytes); registrations being hashed and probed
  // (more wait for the uid's own); streaming gRPC calls.
  int max_control_connections_per_uid = 64;
  // Watch connections (re-pointing local binds, docs/replace.md): one per
  // process that holds a replaceable target locally.
  int max_watch_connections_per_uid = 256;
  // Connections to the session socket waiting for their first request.
  int max_pending_connections_per_uid = 32;
  double control_idle_timeout_s = 60;
  uint64_t max_upload_bytes_per_uid = 0;
  int max_heavy_work_per_uid = 2;
  // Call-site states of handler bundles one uid's sessions hold at once.
  int max_states_per_uid = 65536;
  int max_grpc_calls_per_uid = 32;
  // gRPC: concurrent streams on one connection, and the threads serving
  // all calls (grpc::ResourceQuota; a call beyond them is refused with
  // RESOURCE_EXHAUSTED instead of a new thread).
  int max_grpc_streams_per_connection = 16;
  int grpc_max_threads = 256;
  // Cluster mode (DESIGN §10); off while etcd_endpoints is empty.
  std::vector<std::string> etcd_endpoints;
  std::string cluster = "default";
  std::string advertise;    // HOST:PORT peers fetch modules from
  std::string peer_listen;  // empty: the advertise address
  std::string host_name;    // empty: gethostname()
  std::string peer_tls_ca, peer_tls_cert, peer_tls_key;
  // The cluster key that signs every record in etcd (required in cluster
  // mode), and whether plaintext http:// etcd endpoints are allowed.
  std::string cluster_key_file;
  bool cluster_insecure = false;
  double etcd_timeout_s = 5;
  int64_t peer_lease_ttl_s = 10;
  // The Prometheus endpoint: "" (off), "127.0.0.1:PORT", "[::1]:PORT" or
  // "unix:/path"; other addresses need metrics_allow_remote.
  std::string metrics_listen;
  bool metrics_allow_remote = false;
  // The CPU launch ring (DESIGN §9): offered to clients; the executor side
  // spins this long for the next descriptor before it sleeps on the futex.
  bool launch_ring = true;
  int64_t ring_spin_us = 50;
  // The compile service (DESIGN §13; config_compile.cc).
  int64_t max_parallel_compiles = 0;  // 0: half the cores (at least 1)
  int64_t compile_cpu_s = 300;
  double compile_timeout_s = 600;
  uint64_t compile_memory_bytes = 4ull << 30;
  uint64_t compile_output_bytes = 256ull << 20;
  int64_t compile_max_processes = 64;
  // The compile queue (CompileQueueLimits).
  int64_t compile_max_running_per_uid = 2;
  int64_t compile_max_queued = 128;
  int64_t compile_max_queued_per_uid = 32;
  uint64_t compile_max_queued_bytes = 256ull << 20;
  uint64_t compile_max_queued_bytes_per_uid = 64ull << 20;
  uint64_t compile_cache_bytes = 2ull << 30;
  std::string compile_cxx = "/usr/bin/g++";
  std::string compile_nvcc;  // empty: PATH, /usr/local/cuda/bin
  // Empty: the XLA FFI headers kregd was built against, shipped beside it.
  std::string compile_ffi_include_dir;
  std::string compile_binary;  // empty: kregd-compile next to kregd

  // Where each key's value came from (operator guide, "Seeing the effective
  // configuration"): the config file's path, "--flag" or "$ENV"; a key
  // absent here has its default. Filled by ParseConfig.
  std::map<std::string, std::string> origins;
  std::string config_file;  // --config, or empty
};

// One key of the effective configuration: its value as a TOML literal
// (strings, integers, floats, booleans and arrays of strings, written so
// that the literal is also valid JSON) and where it came from: "default",
// the config file's path or "--flag".
struct ConfigEntry {
  std::string key;
  std::string value_toml;
  std::string origin;
};

// Every key a config file may set, in the order of docs/kregd.toml.example.
std::vector<ConfigEntry> DescribeConfig(const Config& c);
// The effective configuration as a TOML file kregd accepts back with
// --config: one `key = value  # origin` line per key (kregctl config).
std::string ConfigToml(const Config& c);

// The largest ring_spin_us accepted (1 s: a longer spin only burns a core).
inline constexpr int64_t kMaxRingSpinUs = 1000000;

}  // namespace kreg

#endif  // KREGD_DAEMON_CONFIG_CONFIG_FIELDS_H_
