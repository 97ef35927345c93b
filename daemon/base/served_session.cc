#include "daemon/base/served_session.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include <string>

#include "common/wire.h"
#include "kreg/v1/session.pb.h"
#include "spdlog/spdlog.h"

namespace kreg {

void ToWireStatus(const absl::Status& status, v1::SessionStatus* out) {
  out->set_code(static_cast<int>(status.code()));
  out->set_message(std::string(status.message()));
}

absl::Status FromWireStatus(const v1::SessionStatus& status) {
  const int code = status.code();
  if (code == 0) return absl::OkStatus();
  return absl::Status(code > 0 && code <= 16
                          ? static_cast<absl::StatusCode>(code)
                          : absl::StatusCode::kUnknown,
                      status.message());
}

void SendConnectionError(int sock, const absl::Status& status) {
  v1::SessionResponse resp;
  resp.set_id(0);
  ToWireStatus(status, resp.mutable_status());
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
