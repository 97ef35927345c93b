// How kregd starts its helper processes (kregd-exec, DESIGN §8;
// kregd-compile, DESIGN §13).
#ifndef KREGD_DAEMON_BASE_SPAWN_H_
#define KREGD_DAEMON_BASE_SPAWN_H_

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace kreg {

// Starts `binary` (argv: just its path) with posix_spawn in its own process
// group (a terminal's ^C reaches kregd, which stops its helpers, not the
// helpers directly), every signal unblocked and at its default action, the
// descriptors of `dups` (from, to) duplicated and `env` (null-terminated)
// as its whole environment. Returns posix_spawn's result (0 or an errno
// value) and sets `*pid` on success.
int SpawnInOwnGroup(const std::string& binary,
                    const std::vector<std::pair<int, int>>& dups,
                    char* const env[], pid_t* pid);

}  // namespace kreg

#endif  // KREGD_DAEMON_BASE_SPAWN_H_
