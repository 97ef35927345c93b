// One run of a compiler for kregd-compile (DESIGN §13,
// docs/operator-guide.md "The compile service"): the process, its limits,
// its output, and which limit stopped it.
#ifndef KREGD_DAEMON_KREGD_COMPILE_COMPILER_PROCESS_H_
#define KREGD_DAEMON_KREGD_COMPILE_COMPILER_PROCESS_H_

#include <signal.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/kregd_compile/sandbox.h"
#include "kreg/v1/compile.pb.h"

namespace kreg {

struct CompilerRun {
  int status = 0;    // wait4's
  double cpu_s = 0;  // the compiler's processes, together
  bool timed_out = false;
  std::string output;  // stdout and stderr, at most max_output bytes
  bool truncated = false;
};

// Runs argv (argv[0] an absolute path) with `env` in `cwd`, in its own
// process group, under `limits` (a parent-death signal too); stdout and
// stderr go to one pipe, of which the first `max_output` bytes are kept.
// Kills the whole group at `wall_s` or when the driver is done. INTERNAL
// when the pipe or the process cannot be made.
// While it runs, *running_group (when given) holds its process group, so
// that a signal handler can end the whole compile.
absl::StatusOr<CompilerRun> RunCompiler(
    const std::vector<std::string>& argv, const std::string& cwd,
    const ChildLimits& limits, double wall_s,
    const std::vector<std::string>& env, size_t max_output,
    volatile sig_atomic_t* running_group = nullptr);

// Which limit a failed run hit (a config key: compile_timeout_s,
// compile_cpu_s, compile_output_bytes, compile_memory_bytes,
// compile_max_processes), from how it ended and what the compiler said;
// empty for an ordinary compile error.
std::string LimitHit(const CompilerRun& r, const v1::CompileLimits& l);

// "the memory limit of N bytes", ... for LimitHit's key.
std::string LimitText(const std::string& key, const v1::CompileLimits& l);

}  // namespace kreg

#endif  // KREGD_DAEMON_KREGD_COMPILE_COMPILER_PROCESS_H_
