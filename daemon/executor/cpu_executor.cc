#include "daemon/executor/cpu_executor.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/executor/session.h"

namespace kreg {

absl::Status CpuExecutor::Launch(uint64_t request_id,
                                 const RingLaunchHeader& header,
                                 const RingDecode& decode,
                                 const v1::Launch& /*launch*/,
                                 std::vector<UniqueFd> fds,
                                 v1::LaunchReply* /*reply*/) {
  if (!fds.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        fds.size(), " file descriptor(s) attached to a CPU launch"));
  }
  return RingLaunch(request_id, header, decode, nullptr, nullptr);
}

absl::Status CpuExecutor::RingLaunch(uint64_t tag,
                                     const RingLaunchHeader& /*header*/,
                                     const RingDecode& decode,
                                     uint32_t* /*flags*/,
                                     bool* /*end_session*/) {
  absl::StatusOr<DecodedLaunch*> decoded = decode(nullptr);
  if (!decoded.ok()) return decoded.status();
  return Run(tag, **decoded);
}

absl::Status CpuExecutor::Run(uint64_t request_id,
                              const DecodedLaunch& decoded) {
  absl::StatusOr<ResolvedHandler> handler =
      ctx_.handlers->Lookup(decoded.key, decoded.generation);
  if (!handler.ok()) return handler.status();
  ctx_.backend->BeginLaunch(request_id, decoded.key, handler->token);
  CallOptions options;
  options.frame_cache = &frames_;
  absl::Status status =
      ctx_.backend->ExecuteWith(handler->handler, decoded.frame, options);
  ctx_.backend->EndLaunch(status.ok());
  return status;
}

}  // namespace kreg
