#include "common/paths.h"

#include <sys/stat.h>

#include <cstdlib>

namespace kreg {
namespace {

// `$name` + suffix when $name is an absolute path, else the fallback.
std::string EnvOr(const char* name, const std::string& suffix,
                  const std::string& fallback) {
  const char* v = std::getenv(name);
  if (v != nullptr && v[0] == '/') return std::string(v) + suffix;
  return fallback;
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

std::string SessionSocketPath(const std::string& grpc_socket_path) {
  return grpc_socket_path + ".session";
}

}  // namespace kreg
