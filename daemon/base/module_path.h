// Opening a daemon-side module path on a caller's behalf (DESIGN §6):
// resolved and opened beneath one of the allowed roots, regular files only,
// never opened for reading before it is known to be one (a FIFO or device
// would block or have side effects), and, when kregd runs as root, with the
// caller's own uid, gid and groups in a helper process (`kregd-probe
// --open-as`), so that every directory on the way is checked for them.
#ifndef KREGD_DAEMON_BASE_MODULE_PATH_H_
#define KREGD_DAEMON_BASE_MODULE_PATH_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace kreg {

// How far opening a path got, and why it stopped.
struct PathOpen {
  enum Stage {
    kUnresolved,    // realpath failed: err
    kOutsideRoots,  // real is under no allowed root
    kOpenFailed,    // opening real beneath root failed: err (EXDEV or ELOOP
                    // for an escape swapped in after realpath)
    kNotRegular,    // real is not a regular file: mode
    kCredentials,   // the helper could not take the caller's credentials: err
    kOpened,        // fd is open for reading on a regular file
  };
  Stage stage = kUnresolved;
  int err = 0;
  mode_t mode = 0;
  std::string real;  // the resolved path, from kOutsideRoots on
  std::string root;  // the allowed root holding it, from kOpenFailed on
  UniqueFd fd;
};

// "a FIFO", "a directory", "a socket", "a character device", ... for
// messages.
const char* FileTypeName(mode_t mode);

// Resolves `path` (absolute, no NUL) with this process's credentials and
// opens it beneath the allowed root that holds it: openat2 with O_PATH |
// O_NOFOLLOW and RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS (open(O_NOFOLLOW)
// before Linux 5.6), fstat, and only a regular file is re-opened for
// reading (through /proc/self/fd). Never blocks on a FIFO or device.
PathOpen OpenModulePath(const std::string& path,
                        const std::vector<std::string>& roots);

// Runs OpenModulePath in `helper` (kregd-probe, posix_spawn) with uid `uid`,
// gid `gid` and uid's groups from getgrouplist (only `gid` when uid has no
// passwd entry), and receives the descriptor over a socketpair
// (SCM_RIGHTS). Needs kregd to run as root. INTERNAL when the helper cannot
// be started or answers nonsense, DEADLINE_EXCEEDED when it does not answer
// within 10 s (the helper is killed).
absl::StatusOr<PathOpen> OpenModulePathAs(const std::string& helper,
                                          const std::string& path,
                                          const std::vector<std::string>& roots,
                                          uid_t uid, gid_t gid);

// The helper's side: `kregd-probe --open-as UID GID PATH ROOT...` with the
// reply socket as fd 3. Drops to the caller's credentials, runs
// OpenModulePath and sends the result. Returns the exit status.
int ServeOpenAs(int argc, char** argv);

// The helper's reply (one wire frame; the fd travels as SCM_RIGHTS).
std::string EncodePathOpen(const PathOpen& r);
absl::StatusOr<PathOpen> DecodePathOpen(const std::string& payload);

}  // namespace kreg

#endif  // KREGD_DAEMON_BASE_MODULE_PATH_H_
