// A kregd older than session protocol 1.7 speaks the flat registration
// messages of session.proto (RegisterRequest, TargetInfo, RegisterReply,
// ListReply): the shim sends its registrations in them and turns their
// replies into registration.proto's, so the rest of the shim reads one form
// and a client library newer than its kregd keeps working.
#ifndef KREGD_CLIENT_SHIM_LEGACY_REGISTRATION_H_
#define KREGD_CLIENT_SHIM_LEGACY_REGISTRATION_H_

#include <cstdint>
#include <string>

#include "kreg/v1/session.pb.h"

namespace kreg {
namespace shim {

// The first session-protocol minor whose kregd reads registration.proto's
// messages (daemon/session/protocol_version.h).
constexpr uint32_t kFirstEmbeddedRegistrationMinor = 7;

// `header` as a RegisterRequest. An upload (module.upload_size) goes by fd
// (upload_fd_size), or inline as `module` when `inline_upload` (a kregd
// before 1.3, which announces no max_module_bytes).
v1::RegisterRequest ToLegacyRegister(const v1::RegisterTargetHeader& header,
                                     const std::string& module,
                                     bool inline_upload);

// `info` as a Target (Audit gathered from the flat fields).
v1::Target FromTargetInfo(const v1::TargetInfo& info);

// Replaces a 1.0-1.6 reply body (legacy_register, legacy_list,
// bind_local.legacy_target) by its registration.proto form; other
// responses are left alone.
void AdoptLegacyReply(v1::SessionResponse* response);

}  // namespace shim
}  // namespace kreg

#endif  // KREGD_CLIENT_SHIM_LEGACY_REGISTRATION_H_
