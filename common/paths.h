// Where kregd listens and keeps its state by default: shared by the daemon,
// kregctl and (in Python) the kreg package, which must agree.
#ifndef KREGD_COMMON_PATHS_H_
#define KREGD_COMMON_PATHS_H_

#include <string>

namespace kreg {

// $XDG_RUNTIME_DIR/kregd/kregd.sock or /run/kregd/kregd.sock.
std::string DefaultSocketPath();
// $XDG_STATE_HOME/kregd or /var/lib/kregd.
std::string DefaultStateDir();
// The session (data-plane) socket beside a gRPC socket.
std::string SessionSocketPath(const std::string& grpc_socket_path);

}  // namespace kreg

#endif  // KREGD_COMMON_PATHS_H_
