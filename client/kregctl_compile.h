// `kregctl compile`: kregd compiles sources once and registers the result
// (DESIGN §13, docs/user-guide.md "Compile once").
#ifndef KREGD_CLIENT_KREGCTL_COMPILE_H_
#define KREGD_CLIENT_KREGCTL_COMPILE_H_

#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "client/kregctl_common.h"

namespace kreg {

struct CompileArgs {
  std::string target_name;
  std::string func_name;
  std::vector<std::string> sources;       // paths; sent by their base name
  std::vector<std::string> headers;       // paths; sent by their base name
  std::vector<std::string> include_dirs;  // sent as their files
  std::vector<std::string> options;
  std::string platform = "cpu";
  std::string content_id;
  double timeout_s = 900;
  bool as_json = false;
};

// Adds the `compile` subcommand.
Command AddCompileCommand(CLI::App& app);
// Reads the files (as this process: what the caller cannot read is not
// sent), compiles, prints the registration (or JSON); the compiler's
// output goes to stderr verbatim. Returns the exit code.
int RunCompile(Client& client, const CompileArgs& args);

}  // namespace kreg

#endif  // KREGD_CLIENT_KREGCTL_COMPILE_H_
