// The Registry core's extension points (docs/design.md, "The registry"):
// small interfaces a feature implements to take part in registration
// without editing the core. Each is consulted by the core as documented;
// none may call back into the core from under its lock.
#ifndef KREGD_DAEMON_REGISTRY_EXTENSION_POINTS_H_
#define KREGD_DAEMON_REGISTRY_EXTENSION_POINTS_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/base/types.h"
#include "daemon/registry/register_args.h"

namespace kreg {

// What an admission policy's slow look-ups (Screen) found, for its
// decision under the registry's lock (Admit).
struct AdmissionNote {
  std::optional<std::vector<gid_t>> groups;  // the caller's groups
};

// Extension point: asked before every decision, in the order added.
class AdmissionPolicy {
 public:
  virtual ~AdmissionPolicy() = default;
  // Outside the registry's lock (NSS look-ups belong here): a refusal ends
  // the request before it waits for its key.
  virtual absl::Status Screen(const RegisterArgs& args,
                              AdmissionNote* note) const = 0;
  // Under the registry's lock, as the decision is made: quick, and must
  // not call into the registry.
  virtual absl::Status Admit(const RegisterArgs& args,
                             const AdmissionNote& note) const = 0;
};

// Extension point: asked when a request brings other content for a
// registered key, which the core refuses.
class ChangePolicy {
 public:
  virtual ~ChangePolicy() = default;
  // Appended to the core's refusal of `kind` content under `existing`'s key
  // by `request` (null: a journaled entry at start-up).
  virtual std::string RefusalHint(const TargetEntry& existing, TargetKind kind,
                                  const RegisterArgs* request) const = 0;
  // OK with `*take` set: the change is made by Change. OK without: the
  // core refuses. An error: this refusal instead. May be called twice
  // (before the key's hold and under the registry's lock).
  virtual absl::Status Accept(const TargetEntry& existing,
                              const RegisterArgs& args, bool* take) const = 0;
  // Makes the change while the key is held (a Registry::Install).
  virtual absl::StatusOr<RegisterOutcome> Change(const RegisterArgs& args,
                                                 const std::string& digest,
                                                 const std::string& cid,
                                                 const EntryPtr& existing) = 0;
  // Every successful registration's outcome once its key is released.
  virtual absl::StatusOr<RegisterOutcome> Finish(RegisterOutcome out) = 0;
};

// Extension point: consulted around every install and retirement.
class InstallHook {
 public:
  virtual ~InstallHook() = default;
  // The handler of `entry` was probed; it is not committed yet.
  virtual absl::Status Probed(const TargetEntry& entry,
                              const HandlerInfo& info) {
    (void)entry, (void)info;
    return absl::OkStatus();
  }
  // Before `entry` (which follows `previous`, when not null) is journaled;
  // may fill in its fields. An error aborts the install.
  virtual absl::Status Committing(TargetEntry* entry,
                                  const TargetEntry* previous) {
    (void)entry, (void)previous;
    return absl::OkStatus();
  }
  // `entry` is installed here.
  virtual void Committed(const TargetEntry& entry) { (void)entry; }
  // Before the retirement of `entry` is journaled; an error keeps it.
  virtual absl::Status Retiring(const TargetEntry& entry) {
    (void)entry;
    return absl::OkStatus();
  }
};

// Extension point: makes the registration of a key that has no entry here
// (inside its hold), instead of the core's own install.
class KeyBinder {
 public:
  virtual ~KeyBinder() = default;
  virtual absl::StatusOr<RegisterOutcome> BindNew(const RegisterArgs& args,
                                                  const std::string& digest,
                                                  const std::string& cid) = 0;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_REGISTRY_EXTENSION_POINTS_H_
