// The control connections of the session socket (DESIGN §3): a connection
// whose first request is not Hello is served by kregd itself, here:
// control_hello, the shim's registrations (a module sent as a sealed
// memfd), listings and local re-pointing's watch. The gRPC service
// (grpc_service.h) is the other door to the same Registrar.
#ifndef KREGD_DAEMON_API_CONTROL_REQUESTS_H_
#define KREGD_DAEMON_API_CONTROL_REQUESTS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "daemon/base/types.h"
#include "daemon/base/uid_account.h"
#include "daemon/supervisor/broker.h"
#include "kreg/v1/executor.pb.h"

namespace kreg {

class Registrar;

// kregd's intake of a registration sent on a control connection with `fds`
// attached to its frame: an upload (module.upload_size) must come as
// exactly one memfd sealed with kModuleSeals of exactly that size, is
// prechecked (Registrar::PrecheckUpload, for `peer`) before a byte is read
// and its bytes are returned; any other registration carries no descriptor
// and gets "" (INVALID_ARGUMENT otherwise). The module's announced bytes
// are charged to `peer`'s share of upload bytes in flight in `account`
// (null: unbounded) into `hold` before they are read: RESOURCE_EXHAUSTED,
// naming the limit, when the uid's share cannot cover them; the caller
// keeps `hold` until it is done with the bytes.
absl::StatusOr<std::string> TakeUploadedModule(
    Registrar* registrar, const v1::RegisterTargetHeader& header,
    std::vector<UniqueFd> fds, const PeerCred& peer, uint64_t max_module_bytes,
    UidAccount* account, UidAccount::Charge* hold);

// Answers one request of a control connection (`request`, with `fds`
// attached) of session id `id` from `peer`: control_hello (kregd's protocol
// version and max_module_bytes; another major sets `*close`),
// RegisterTarget (the registration is held by `id` until RemoveSession),
// List and Watch (reserved with ctx.local_repointer: the caller then serves
// the connection as a watch connection; refused, with `*close`, otherwise).
// Any other request sets `*close` and gets an error naming it. Shared with
// the fuzzer.
v1::SessionResponse HandleControl(const BrokerContext& ctx, uint64_t id,
                                  const PeerCred& peer,
                                  const v1::SessionRequest& request,
                                  std::vector<UniqueFd> fds, bool* close);

}  // namespace kreg

#endif  // KREGD_DAEMON_API_CONTROL_REQUESTS_H_
