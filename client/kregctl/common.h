// What kregctl's subcommands share: the connection to kregd, the exit code
// of a failed call, and the output helpers for targets and key/value lists.
// Each subcommand is one function that adds its CLI11 node and returns a
// Command; main.cc runs the one that was parsed.
#ifndef KREGD_CLIENT_KREGCTL_COMMON_H_
#define KREGD_CLIENT_KREGCTL_COMMON_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "client/client.h"
#include "nlohmann/json.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace kreg {

// The kregd a subcommand talks to; `client` is not owned.
struct Connection {
  std::string socket;  // --socket or $KREGD_SOCKET
  Client* client;
};

// One kregctl subcommand: its CLI11 node (owned by the parent app) and what
// it does once parsed, returning kregctl's exit code.
struct Command {
  CLI::App* app;
  std::function<int(Connection&)> run;
};

// The exit code of a failed call (docs/errors.md, "Exit status of
// kregctl"): 2 INVALID_ARGUMENT or UNIMPLEMENTED, 3 FAILED_PRECONDITION,
// 4 UNAVAILABLE, 1 otherwise; 0 for OK.
int ExitCode(const absl::Status& s);
// Prints the daemon's message to stderr unchanged; returns ExitCode(s).
int Fail(const absl::Status& s);

// Microseconds since the epoch as "YYYY-MM-DDTHH:MM:SSZ".
std::string UtcTime(int64_t us);
// A target as `kregctl list --json` and `show --json` print it.
nlohmann::ordered_json TargetJson(const v1::Target& t);
// One "key: value" line per field, strings unquoted.
void PrintFields(const nlohmann::ordered_json& j);

// stats.cc: launch statistics (status, show) and live sessions.
// {"launches", "errors", "latency_us": {"count", "p50", "p90", "p99"}}
nlohmann::ordered_json StatsJson(const v1::TargetStats& s);
// One line: "launches 10, errors 1, latency p50 3.2 us, p90 ..., p99 ...".
std::string StatsLine(const v1::TargetStats& s);
// A table of targets with calls (nothing when there are none).
void PrintStatsTable(
    const google::protobuf::RepeatedPtrField<v1::TargetStats>& stats);
nlohmann::ordered_json SessionJson(const v1::SessionInfo& s);
void PrintSessionsTable(const v1::ListSessionsResponse& sessions);

// The subcommands. Each adds its CLI11 subcommand (name, help, flags) to
// `app` and returns what runs it; main adds them in the order of
// `kregctl --help`.
// targets.cc: the registered targets.
Command AddListCommand(CLI::App& app);
Command AddShowCommand(CLI::App& app);
Command AddUnquarantineCommand(CLI::App& app);
Command AddRetireCommand(CLI::App& app);
Command AddReserveCommand(CLI::App& app);

// register.cc
Command AddRegisterCommand(CLI::App& app);

// compile.cc: kregd compiles sources once and registers the result
// (DESIGN §13); the compiler's output goes to stderr verbatim.
Command AddCompileCommand(CLI::App& app);

// daemon.cc: the daemon itself.
Command AddStatusCommand(CLI::App& app);
Command AddConfigCommand(CLI::App& app);
Command AddHealthCommand(CLI::App& app);
Command AddSessionsCommand(CLI::App& app);
Command AddGcCommand(CLI::App& app);

// cluster.cc: cluster mode.
Command AddHostsCommand(CLI::App& app);
// `list --cluster`: every binding in etcd (a table with the registering
// host, or JSON). Returns the exit code.
int ListCluster(Client& client, bool as_json);

}  // namespace kreg

#endif  // KREGD_CLIENT_KREGCTL_COMMON_H_
