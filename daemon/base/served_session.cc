#include "daemon/base/served_session.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include <string>

#include "common/wire.h"
#include "kreg/v1/session.pb.h"
#include "spdlog/spdlog.h"

namespace kreg {

void SendConnectionError(int sock, const absl::Status& status) {
  v1::SessionResponse resp;
  resp.set_id(0);
  resp.mutable_status()->set_code(static_cast<int>(status.code()));
  resp.mutable_status()->set_message(std::string(status.message()));
  wire::SendMessage(sock, resp);
}

absl::StatusOr<PeerCred> PeerCredOf(int sock) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    spdlog::warn("SO_PEERCRED failed: {}", strerror(errno));
    return absl::InternalError("peer credentials are not available");
  }
  PeerCred peer;
  peer.uid = cred.uid;
  peer.gid = cred.gid;
  peer.pid = cred.pid;
  return peer;
}

}  // namespace kreg
