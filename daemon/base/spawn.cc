#include "daemon/base/spawn.h"

#include <signal.h>
#include <spawn.h>

namespace kreg {

int SpawnInOwnGroup(const std::string& binary,
                    const std::vector<std::pair<int, int>>& dups,
                    char* const env[], pid_t* pid) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  for (const auto& [from, to] : dups) {
    posix_spawn_file_actions_adddup2(&actions, from, to);
  }
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK |
                                      POSIX_SPAWN_SETSIGDEF |
                                      POSIX_SPAWN_SETPGROUP);
  std::string arg0 = binary;
  char* argv[] = {arg0.data(), nullptr};
  const int rc = ::posix_spawn(pid, binary.c_str(), &actions, &attr, argv, env);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  return rc;
}

}  // namespace kreg
