// Where kregd listens and keeps its state by default: shared by the daemon,
// kregctl and (in Python) the kreg package, which must agree.
#ifndef KREGD_COMMON_PATHS_H_
#define KREGD_COMMON_PATHS_H_

#include <string>

namespace kreg {

// Where kregd binds by default: $XDG_RUNTIME_DIR/kregd/kregd.sock or
// /run/kregd/kregd.sock.
std::string DefaultSocketPath();
// Where clients (kregctl, the shim, Python's kreg) look for kregd:
// $KREGD_SOCKET, else $XDG_RUNTIME_DIR/kregd/kregd.sock when that exists (a
// private kregd), else the system kregd's /run/kregd/kregd.sock.
std::string ClientSocketPath();
// $XDG_STATE_HOME/kregd or /var/lib/kregd.
std::string DefaultStateDir();
// Why this process may not connect to kregd's socket at `path`: its owner,
// group and mode, this process's ids and what to ask the operator for; empty
// when the socket is missing or connecting is allowed.
std::string SocketPermissionProblem(const std::string& path);
// The session (data-plane) socket beside a gRPC socket.
std::string SessionSocketPath(const std::string& grpc_socket_path);

}  // namespace kreg

#endif  // KREGD_COMMON_PATHS_H_
