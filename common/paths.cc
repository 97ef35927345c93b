#include "common/paths.h"

#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace kreg {
namespace {

// `$name` + suffix when $name is an absolute path, else the fallback.
std::string EnvOr(const char* name, const std::string& suffix,
                  const std::string& fallback) {
  const char* v = std::getenv(name);
  if (v != nullptr && v[0] == '/') return std::string(v) + suffix;
  return fallback;
}

// "name (gid N)", or "gid N" when the group has no name here.
std::string GroupText(gid_t gid) {
  group g;
  group* found = nullptr;
  std::vector<char> buf(16384);
  if (::getgrgid_r(gid, &g, buf.data(), buf.size(), &found) == 0 &&
      found != nullptr) {
    return std::string(g.gr_name) + " (gid " + std::to_string(gid) + ")";
  }
  return "gid " + std::to_string(gid);
}

}  // namespace

std::string DefaultSocketPath() {
  return EnvOr("XDG_RUNTIME_DIR", "/kregd/kregd.sock", "/run/kregd/kregd.sock");
}

std::string ClientSocketPath() {
  const char* env = std::getenv("KREGD_SOCKET");
  if (env != nullptr && env[0] != '\0') return env;
  const std::string mine = DefaultSocketPath();
  struct stat st;
  if (::stat(mine.c_str(), &st) == 0) return mine;
  return "/run/kregd/kregd.sock";
}

std::string DefaultStateDir() {
  return EnvOr("XDG_STATE_HOME", "/kregd", "/var/lib/kregd");
}

std::string SocketPermissionProblem(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return "";
  if (::access(path.c_str(), R_OK | W_OK) == 0 || errno != EACCES) return "";
  char mode[8];
  std::snprintf(mode, sizeof(mode), "%04o", st.st_mode & 07777);
  std::string text = "permission denied connecting to kregd's socket " + path +
                     " (owner uid " + std::to_string(st.st_uid) + ", group " +
                     GroupText(st.st_gid) + ", mode " + mode +
                     "; this process runs as uid " +
                     std::to_string(::geteuid()) + ", gid " +
                     std::to_string(::getegid()) + "): kregd is running, but ";
  if (st.st_gid == 0) {
    return text +
           "its socket_group is not set, so only root may connect; ask the "
           "operator to set socket_group (e.g. a group kregd) and add your "
           "user to it, then log in again";
  }
  return text +
         "only its group may connect; ask the operator to add your user to "
         "that group (kregd's socket_group) and log in again";
}

std::string SessionSocketPath(const std::string& grpc_socket_path) {
  return grpc_socket_path + ".session";
}

}  // namespace kreg
