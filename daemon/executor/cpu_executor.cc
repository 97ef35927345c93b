#include "daemon/executor/cpu_executor.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "daemon/executor/session_backend.h"
#include "daemon/executor/state_table.h"

namespace kreg {

absl::Status CpuExecutor::Launch(Request* request) {
  if (request->socket != nullptr && !request->socket->fds.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(request->socket->fds.size(),
                     " file descriptor(s) attached to a CPU launch"));
  }
  absl::StatusOr<DecodedLaunch*> decoded = request->decode(nullptr);
  if (!decoded.ok()) return decoded.status();
  return Run(request->id, **decoded);
}

absl::Status CpuExecutor::Run(uint64_t request_id,
                              const DecodedLaunch& decoded) {
  CallOptions options;
  options.frame_cache = &frames_;
  ResolvedHandler run;
  if (decoded.state != 0) {
    // A call site with a state runs the bundle that made it
    // (docs/replace.md, "States across a replacement").
    KREG_ASSIGN_OR_RETURN(
        StateTable::Entry held,
        ctx_.states->Get(decoded.state, ctx_.peer.pid, decoded.key));
    options.state = held.state;
    run.handler = held.owner.stages[kExecute];
    run.token = held.owner.token;
  } else {
    KREG_ASSIGN_OR_RETURN(
        run, ctx_.handlers->Lookup(decoded.key, decoded.generation));
  }
  ctx_.backend->BeginLaunch(request_id, decoded.key, run.token);
  absl::Status status =
      ctx_.backend->ExecuteWith(run.handler, decoded.frame, options);
  ctx_.backend->EndLaunch(status.ok());
  return status;
}

}  // namespace kreg
