// The one entry point for registration requests from any front end (gRPC,
// sessions): validates the request, reads the module, calls the Registry.
#ifndef KREGD_DAEMON_REGISTRY_REGISTRAR_H_
#define KREGD_DAEMON_REGISTRY_REGISTRAR_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/registry/registry.h"

namespace kreg {

struct ModulePolicy {
  // Daemon-side paths are read only under these (canonical) directories.
  std::vector<std::string> allowed_roots;
  // Largest module accepted, uploaded or read from a path.
  uint64_t max_module_bytes = 512ull << 20;
  // kregd-probe, which opens paths with a caller's credentials
  // (`--open-as`) when kregd runs as root. Empty: mode bits only.
  std::string open_helper;
};

// Reads a daemon-side module for `peer` (see module_path.h): `path` must be
// absolute, valid UTF-8 without NUL, resolve under one of the allowed roots
// and name a regular file (a FIFO, device, socket or directory is refused
// without being opened for reading). A peer other than root or kregd's own
// uid must be able to reach and read it with its own credentials: checked
// by opening it in `policy.open_helper` as the peer's uid, gid and groups
// when kregd runs as root, else by the mode bits of every directory on the
// way and of the file. INVALID_ARGUMENT for a bad path or a file that is
// not regular or too large (the value quoted), PERMISSION_DENIED outside
// the roots or when the peer may not read it ("... as uid N"), NOT_FOUND
// when missing, DEADLINE_EXCEEDED when the helper hangs.
absl::StatusOr<std::string> ReadModuleForPeer(const std::string& path,
                                              const ModulePolicy& policy,
                                              const PeerCred& peer);

// One registration request as every front end hands it over (the gRPC
// RegisterTarget stream, a session's registration through its broker; both
// mapped by registration_mapper.h): the client's text fields still
// unvalidated (Registrar checks them, once) and where the module comes from.
struct RegistrationRequest {
  enum class Source { kNone, kPath, kUpload };

  std::string target_name;
  std::string func_name;
  std::string platform;  // "cpu"/"host"/"cuda"/"gpu", any case
  std::string content_id;
  std::string file_name;  // the module's name on the client (messages only)
  bool replace = false;
  bool in_process = false;
  // Set by the compile service only (never mapped from a client): its
  // content_id may be a cache key, "kcc-..." (ValidateClientContentId).
  bool compiled = false;
  Source source = Source::kNone;
  std::string path;          // kPath: a path on the daemon's host
  uint64_t upload_size = 0;  // kUpload: the size the client announced
  std::string upload;        // kUpload: the bytes that arrived
};

// Why a registration was refused, for kregd_registrations_refused_total's
// `reason` label (operator guide, "Metrics"): a small fixed set, derived
// from the refusal's status code.
enum class RefusalReason {
  kConflict,     // FAILED_PRECONDITION: the name is bound to other content
  kInvalid,      // INVALID_ARGUMENT, UNIMPLEMENTED: bad request or module
  kQuota,        // RESOURCE_EXHAUSTED: a per-uid limit
  kPermission,   // PERMISSION_DENIED
  kUnavailable,  // UNAVAILABLE, DEADLINE_EXCEEDED: etcd, the probe helper
  kOther,        // anything else (INTERNAL, ...)
};
inline constexpr int kNumRefusalReasons = 6;
// The label value of `r`: conflict, invalid, quota, permission,
// unavailable, other.
const char* RefusalReasonName(RefusalReason r);
RefusalReason RefusalReasonOf(absl::StatusCode code);

// Registration outcomes since kregd started.
struct RegistrationCounts {
  uint64_t created = 0;
  uint64_t noop = 0;  // idempotent: identical to the registered entry
  uint64_t refused[kNumRefusalReasons] = {};
};

// Thread-safe; the registry must outlive it.
class Registrar {
 public:
  Registrar(Registry* registry, ModulePolicy policy);

  // An upload's bytes must number upload_size. Errors: INVALID_ARGUMENT for
  // bad fields (quoted), those of ReadModuleForPeer, and the registry's.
  // Every refusal here is logged at info (the registry logs its own
  // decisions).
  absl::StatusOr<RegisterOutcome> Register(RegistrationRequest request,
                                           const PeerCred& peer);

  // Before the bytes of a `size`-byte upload are read: the name and
  // platform checks, max_module_bytes, and the registry's per-uid quotas
  // (Registry::PrecheckUpload), so that an upload that cannot be accepted
  // is refused before it is spent. Refusals are logged as Register's.
  absl::Status PrecheckUpload(const std::string& target_name,
                              const std::string& platform, uint64_t size,
                              const PeerCred& peer);

  const ModulePolicy& policy() const { return policy_; }

  // Outcomes of Register and PrecheckUpload so far. A path kregd may not
  // read (the client uploads instead) is a step, not a refusal: uncounted.
  RegistrationCounts counts() const;

 private:
  // Logs a refusal at info (rate-limited per uid) and returns it.
  absl::Status Refused(absl::Status status, const std::string& target_name,
                       const std::string& platform, const PeerCred& peer);
  // The edge checks: the typed request, or the first error.
  absl::StatusOr<RegisterArgs> Parse(RegistrationRequest& request,
                                     const PeerCred& peer);

  void CountRefusal(absl::StatusCode code);

  Registry* const registry_;
  const ModulePolicy policy_;
  std::atomic<uint64_t> created_{0};
  std::atomic<uint64_t> noop_{0};
  std::atomic<uint64_t> refused_[kNumRefusalReasons] = {};
};

}  // namespace kreg

#endif  // KREGD_DAEMON_REGISTRY_REGISTRAR_H_
