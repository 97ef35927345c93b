// kregctl: admin CLI of kregd. Exit codes (docs/errors.md, "Exit status of
// kregctl", the list the man page is made from): 0 success (including an
// idempotent no-op), 1 other errors, 2 usage or invalid argument (also a
// cluster-only command on a kregd not in cluster mode: UNIMPLEMENTED),
// 3 registration refused, 4 daemon unreachable. The daemon's message goes to
// stderr unchanged.
//
// main only builds the CLI11 app and runs the parsed subcommand; each
// subcommand is a function in targets.cc, register.cc,
// daemon.cc or cluster.cc, declared with what they share
// (the exit codes above, output helpers) in common.h.
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "client/client.h"
#include "client/kregctl/common.h"
#include "common/paths.h"
#include "common/version.h"

namespace {

// The subcommand names of `app`, comma-separated.
std::string CommandList(CLI::App& app) {
  std::string out;
  for (const CLI::App* sub : app.get_subcommands({})) {
    if (!out.empty()) out += ", ";
    out += sub->get_name();
  }
  return out;
}

// "unknown command foo" (exit 2) when the first word that is not a global
// option names no subcommand; CLI11 alone would say "arguments were not
// expected".
bool UnknownCommand(CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--socket") {
      ++i;
      continue;
    }
    if (a.empty() || a[0] == '-') continue;
    for (const CLI::App* sub : app.get_subcommands({})) {
      if (sub->get_name() == a) return false;
    }
    std::cerr << "kregctl: unknown command " << a
              << " (commands: " << CommandList(app)
              << "); run kregctl --help\n";
    return true;
  }
  return false;
}

// KREGD_SOCKET/--socket must name the gRPC socket; the session socket beside
// it speaks another protocol (gRPC would only say "Failed parsing HTTP/2").
bool IsSessionSocket(const std::string& socket) {
  const std::string suffix = ".session";
  if (socket.size() <= suffix.size() ||
      socket.compare(socket.size() - suffix.size(), suffix.size(), suffix) !=
          0) {
    return false;
  }
  std::cerr << "kregctl: " << socket
            << " is kregd's session socket (the data plane of "
               "libkreg_client.so); --socket and KREGD_SOCKET take its gRPC "
               "socket: "
            << socket.substr(0, socket.size() - suffix.size()) << "\n";
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kregctl: inspect and drive kregd"};
  app.require_subcommand(1);
  app.set_version_flag("--version",
                       std::string("kregctl ") + kreg::kKregVersion);
  std::string socket = kreg::ClientSocketPath();
  app.add_option("--socket", socket,
                 "kregd's gRPC socket (default: $KREGD_SOCKET, else "
                 "$XDG_RUNTIME_DIR/kregd/kregd.sock if it exists, else "
                 "/run/kregd/kregd.sock)")
      ->capture_default_str();
  // In the order `kregctl --help` lists them.
  const std::vector<kreg::Command> commands = {
      kreg::AddListCommand(app),         kreg::AddHostsCommand(app),
      kreg::AddShowCommand(app),         kreg::AddCompileCommand(app),
      kreg::AddStatusCommand(app),       kreg::AddConfigCommand(app),
      kreg::AddHealthCommand(app),       kreg::AddSessionsCommand(app),
      kreg::AddUnquarantineCommand(app), kreg::AddRegisterCommand(app),
      kreg::AddRetireCommand(app),       kreg::AddReserveCommand(app),
      kreg::AddGcCommand(app),
  };
  if (UnknownCommand(app, argc, argv)) return 2;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (IsSessionSocket(socket)) return 2;

  kreg::Client client(socket);
  kreg::Connection kregd{socket, &client};
  for (const kreg::Command& command : commands) {
    if (*command.app) return command.run(kregd);
  }
  return 2;  // unreachable: require_subcommand(1)
}
