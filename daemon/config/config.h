// kregd's configuration: embedded defaults, overridden by a TOML file, then
// by command-line flags.
#ifndef KREGD_DAEMON_CONFIG_CONFIG_H_
#define KREGD_DAEMON_CONFIG_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "daemon/config/config_fields.h"

namespace kreg {

// config_cluster.cc: checks the cluster settings once flags and file are
// merged and fills the defaults. INVALID_ARGUMENT naming the key or flag.
absl::Status FinishClusterConfig(Config* c);

// config_compile.cc: the compile service's tools (its keys are in
// config_keys.cc's table).
// nvcc: compile_nvcc, else on PATH, else /usr/local/cuda/bin/nvcc; empty
// when none is found.
std::string CompileNvcc(const Config& c);

// Parses flags (and the --config TOML file they name). INVALID_ARGUMENT
// with the offending flag, key or value. For --help, prints it and sets
// `*exit_now`.
absl::StatusOr<Config> ParseConfig(int argc, char** argv, bool* exit_now);

}  // namespace kreg

#endif  // KREGD_DAEMON_CONFIG_CONFIG_H_
