// The one mapping between kreg.v1's registration messages
// (registration.proto) and kregd's registration types, for both front
// ends: the gRPC RegisterTarget stream (grpc_service.cc) and a control
// connection's registration (supervisor/broker.cc). Free functions of
// plain values; thread-compatible.
#ifndef KREGD_DAEMON_REGISTRY_REGISTRATION_MAPPER_H_
#define KREGD_DAEMON_REGISTRY_REGISTRATION_MAPPER_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/registry/registrar.h"
#include "kreg/v1/registry.pb.h"

namespace kreg {

// `header` and the module bytes that followed it (`upload`: the gRPC
// stream's chunks, or the memfd a session attached) as the Registrar's
// request; the text fields stay unvalidated (Registrar::Register checks
// them). INVALID_ARGUMENT when bytes came although the header announces
// no upload (a module.path, quoted, or no module), naming their count.
absl::StatusOr<RegistrationRequest> ToRegistrationRequest(
    const v1::RegisterTargetHeader& header, std::string upload);

// The function `header` names: func_name, or the bundle its `stages` and
// `state_type` spell (common/handler_spec.h). INVALID_ARGUMENT for an
// unknown or repeated stage, a missing execute stage, a func_name that is
// not the execute function, or a bad symbol, naming the stage and symbol.
absl::StatusOr<std::string> FuncNameOf(const v1::RegisterTargetHeader& header);

// `entry` as a Target with Target.not_runnable (runnable.h) from `cuda`,
// the status of this host's CUDA launches: what both front ends answer
// for a registration, a listing and a local bind.
v1::Target DescribeTarget(const TargetEntry& entry, const absl::Status& cuda);

// Registers `header` with `upload` for `peer` through `registrar`
// (ToRegistrationRequest, Registrar::Register) and answers with the
// entry (DescribeTarget). Errors: ToRegistrationRequest's and the
// Registrar's, verbatim.
absl::StatusOr<v1::RegisterTargetResponse> RegisterFromHeader(
    Registrar* registrar, const v1::RegisterTargetHeader& header,
    std::string upload, const PeerCred& peer, const absl::Status& cuda);

// Every entry of `registry`, described.
v1::ListTargetsResponse DescribeTargets(const Registry& registry,
                                        const absl::Status& cuda);

// The google.rpc.Status detail of a FAILED_PRECONDITION refusal of
// `header` (DESIGN §2): what was requested and, when `registry` has the
// (name, platform) the header names, what it is bound to.
v1::KernelRegistrationError RefusalDetail(
    const v1::RegisterTargetHeader& header, const Registry& registry);

}  // namespace kreg

#endif  // KREGD_DAEMON_REGISTRY_REGISTRATION_MAPPER_H_
