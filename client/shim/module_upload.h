// Registration over a session (session.proto): the header with an upload's
// bytes in a sealed memfd attached to the frame, so the one limit is
// kregd's max_module_bytes on every path (docs/operator-guide.md
// "Configuration", limits).
#ifndef KREGD_CLIENT_SHIM_MODULE_UPLOAD_H_
#define KREGD_CLIENT_SHIM_MODULE_UPLOAD_H_

#include "client/shim/client.h"
#include "client/shim/conn.h"
#include "common/status.h"
#include "kreg/v1/session.pb.h"

namespace kreg {
namespace shim {

// Sends `registration` over `conn` and fills `response` (its
// register_target); an upload's bytes travel as a sealed memfd and
// module.upload_size is set to their count. An upload larger than kregd's
// max_module_bytes is INVALID_ARGUMENT before anything is sent (both sizes
// in the message). Errors as Conn::Call.
ClientStatus CallRegister(Conn* conn, const Registration& registration,
                          uint64_t max_module_bytes,
                          v1::SessionResponse* response);

}  // namespace shim
}  // namespace kreg

#endif  // KREGD_CLIENT_SHIM_MODULE_UPLOAD_H_
