// Registration over a session with the module's bytes in a sealed memfd
// (RegisterRequest.upload_fd_size) instead of inline, so the one limit is
// kregd's max_module_bytes on every path (docs/operator-guide.md
// "Configuration", limits).
#ifndef KREGD_CLIENT_SHIM_MODULE_UPLOAD_H_
#define KREGD_CLIENT_SHIM_MODULE_UPLOAD_H_

#include "client/shim/conn.h"
#include "common/status.h"
#include "kreg/v1/session.pb.h"

namespace kreg {
namespace shim {

// Sends `request` over `conn` and fills `response`. An inline upload larger
// than kregd's max_module_bytes is INVALID_ARGUMENT before anything is sent
// (both sizes in the message); otherwise, when kregd accepts fd uploads
// (Conn::max_module_bytes() != 0), the bytes travel in a sealed memfd and
// the message stays small. Errors as Conn::Call.
ClientStatus CallRegister(Conn* conn, const v1::RegisterRequest& request,
                          v1::SessionResponse* response);

}  // namespace shim
}  // namespace kreg

#endif  // KREGD_CLIENT_SHIM_MODULE_UPLOAD_H_
