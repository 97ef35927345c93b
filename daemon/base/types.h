// Plain value types shared by kregd's components. No behaviour beyond
// formatting; validation lives in validate.h.
#ifndef KREGD_DAEMON_BASE_TYPES_H_
#define KREGD_DAEMON_BASE_TYPES_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace kreg {

// A row of the platform table (common/platforms.h): the enumerator is its
// index (a platform a test adds is the next index; docs/adding-a-platform.md).
enum class Platform { kCpu, kCuda };

// The canonical spelling ("cpu", "cuda"); "?" for an index with no row.
const char* PlatformName(Platform platform);

// Key of the registry, as in XLA's own registry.
struct TargetKey {
  std::string name;
  Platform platform;
  bool operator<(const TargetKey& o) const {
    return std::tie(name, platform) < std::tie(o.name, o.platform);
  }
  bool operator==(const TargetKey& o) const {
    return name == o.name && platform == o.platform;
  }
};

// `target "NAME" (PLATFORM)`, as messages name a target.
std::string Named(const TargetKey& key);

// Microseconds since the epoch (registration and retirement times).
int64_t NowMicros();

// Who is on the other end of a Unix socket (SO_PEERCRED).
struct PeerCred {
  uid_t uid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);
  pid_t pid = 0;
};

// What the XLA FFI metadata call reported about a handler.
struct HandlerInfo {
  uint32_t api_major = 0;
  uint32_t api_minor = 0;
  uint32_t traits = 0;
  int64_t state_type_id = 0;
};

// What runs a target: a module hosted by kregd, or a callable inside the
// JAX process that registered it (kreg.numba_cuda_callable).
enum class TargetKind { kModule, kInProcess };

// "module" or "in-process".
const char* TargetKindName(TargetKind kind);

// One generation of a target replaced under `replace = "owner"`
// (docs/replace.md): its identity, who made it and when.
struct Generation {
  uint32_t generation = 1;
  std::string content_id;
  std::string module_digest;
  uint64_t module_size = 0;
  std::string func_name;
  HandlerInfo handler_info;
  PeerCred by;
  int64_t at_us = 0;
  std::string origin;
};

// One accepted registration. Immutable once in the registry.
struct TargetEntry {
  TargetKey key;
  TargetKind kind = TargetKind::kModule;
  std::string func_name;
  std::string content_id;     // what idempotency compares
  std::string module_digest;  // "sha256:<hex>", the store key; empty for
                              // in-process targets
  uint64_t module_size = 0;
  HandlerInfo handler_info;
  PeerCred registered_by;
  int64_t registered_at_us = 0;
  std::string origin;  // "path:<p>" or "upload:<n> bytes"
  // Cluster mode: the host whose registration made the binding; empty on a
  // standalone kregd.
  std::string host;
  // Empty when executors can load the store copy; why not otherwise (the
  // store file was lost or corrupt at start-up). kregd never dlopens it.
  std::string unavailable;
  // 1 until the target is first replaced; the fields above then describe
  // the current generation, except registered_by/registered_at_us, which
  // stay the owner's first registration.
  uint32_t generation = 1;
  // Empty until the first replacement; then every generation, oldest
  // first, the current one last.
  std::vector<Generation> generations;
};

using EntryPtr = std::shared_ptr<const TargetEntry>;

// The retirement of a (target_name, platform): after it the name may be
// registered again with any content. Journaled like a registration.
struct Retirement {
  TargetKey key;
  std::string content_id;     // of the entry retired (audit)
  std::string module_digest;  // of the entry retired (audit)
  PeerCred retired_by;
  int64_t retired_at_us = 0;
};

// An operator's reservation of target names (`kregctl reserve`): a name it
// matches may be registered only by its owner (a uid, or any member of a
// group) and by root. Journaled; per host.
struct NameReservation {
  std::string pattern;  // a target name, or a name prefix followed by '*'
  bool group = false;   // `owner` is a gid; a uid otherwise
  uint32_t owner = 0;
  PeerCred by;
  int64_t at_us = 0;
  bool Matches(const std::string& name) const;
};

// "uid 1000 (alice)" or "group 50 (staff)"; the name is left out when the
// host has none.
std::string OwnerName(const NameReservation& r);
// "uid 1000 (alice)", likewise.
std::string UserName(uid_t uid);
// `gid` and, where `uid` has a passwd entry, the supplementary groups
// getgrouplist gives that user. Both are NSS lookups, slow on some hosts
// (LDAP): never under a lock that other clients' requests wait on.
std::vector<gid_t> GroupsOf(uid_t uid, gid_t gid);

// A target's crashes and quarantine for one caller uid: a row of the crash
// ledger; the journal records its quarantines. Counted per uid of the
// caller whose call was running, so a user can only ever quarantine a
// target for themselves (the crash attribution comes from the executor's
// status page, which that user's kernel could forge).
struct CrashRecord {
  TargetKey key;
  uid_t uid = 0;
  uint64_t crashes_total = 0;
  int crashes_in_window = 0;
  bool quarantined = false;
  std::string last_reason;
  int64_t last_crash_unix_s = 0;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_BASE_TYPES_H_
