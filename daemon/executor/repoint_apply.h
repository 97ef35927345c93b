// The executor's side of a re-point (docs/replace.md section 3): kregd's
// ExecRepoint turned into a loaded handler in the RepointTable.
#ifndef KREGD_DAEMON_EXECUTOR_REPOINT_APPLY_H_
#define KREGD_DAEMON_EXECUTOR_REPOINT_APPLY_H_

#include <vector>

#include "common/unique_fd.h"
#include "daemon/executor/module_cache.h"
#include "daemon/executor/repoint_table.h"
#include "kreg/v1/executor.pb.h"

namespace kreg {

// Checks `repoint` and its one attached descriptor (`fds`: the module's
// store copy), whose SHA-256 must be repoint.module_digest, loads it
// through `modules`, resolves func_name and Sets the handler (with
// repoint.token, the generation's stats row) in `table`.
// The ack to send kregd: OK, or INVALID_ARGUMENT (no target name, an
// unknown platform, not exactly one descriptor), DATA_LOSS (the bytes are
// not the digest's), NOT_FOUND (the symbol is missing) or INTERNAL (the
// module cannot be loaded), each naming the target and generation.
v1::ExecRepointAck ApplyRepoint(const v1::ExecRepoint& repoint,
                                std::vector<UniqueFd> fds, ModuleCache* modules,
                                RepointTable* table);

}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_REPOINT_APPLY_H_
