// kregctl's subcommands. Each adds its CLI11 subcommand (name, help, flags)
// to `app` and returns what runs it; main adds them in the order of
// `kregctl --help`.
#ifndef KREGD_CLIENT_KREGCTL_COMMANDS_H_
#define KREGD_CLIENT_KREGCTL_COMMANDS_H_

#include "client/kregctl_common.h"

namespace kreg {

// kregctl_targets.cc: the registered targets.
Command AddListCommand(CLI::App& app);
Command AddShowCommand(CLI::App& app);
Command AddUnquarantineCommand(CLI::App& app);
Command AddRetireCommand(CLI::App& app);
Command AddReserveCommand(CLI::App& app);

// kregctl_register.cc
Command AddRegisterCommand(CLI::App& app);

// kregctl_compile.cc: kregd compiles sources once and registers the result
// (DESIGN §13); the compiler's output goes to stderr verbatim.
Command AddCompileCommand(CLI::App& app);

// kregctl_daemon.cc: the daemon itself.
Command AddStatusCommand(CLI::App& app);
Command AddConfigCommand(CLI::App& app);
Command AddHealthCommand(CLI::App& app);
Command AddSessionsCommand(CLI::App& app);
Command AddGcCommand(CLI::App& app);

// kregctl_cluster.cc: cluster mode.
Command AddHostsCommand(CLI::App& app);
// `list --cluster`: every binding in etcd (a table with the registering
// host, or JSON). Returns the exit code.
int ListCluster(Client& client, bool as_json);

}  // namespace kreg

#endif  // KREGD_CLIENT_KREGCTL_COMMANDS_H_
