// Starts the real kregd binary on a temp socket and state dir, for
// integration tests. Binaries and kernels come from the test's runfiles.
#ifndef KREGD_TESTS_TESTING_DAEMON_FIXTURE_H_
#define KREGD_TESTS_TESTING_DAEMON_FIXTURE_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "client/client.h"

namespace kreg::testing {

// Absolute path of a runfile, e.g. Runfile("kernels/cpu/libdemo.so").
std::string Runfile(const std::string& relative);
std::string ReadFile(const std::string& path);
void WriteFile(const std::string& path, const std::string& data);

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Starts argv[0] (absolute) with stdout to `out` and stderr appended to
// `err`; returns its pid, or -1 (the reason appended to `err`) if it could
// not be started. Run() and Kregctl() may be called from several threads:
// they use no Catch2 assertions.
pid_t Spawn(const std::vector<std::string>& argv, const std::string& out,
            const std::string& err);
// Waits for `pid`; WEXITSTATUS, or 128 + the signal that killed it.
int WaitExit(pid_t pid);

// Runs argv[0] (an absolute path) with `argv`, capturing its output;
// exit_code 127 if it could not be started.
CommandResult Run(const std::vector<std::string>& argv);

// Runs kregctl with `args`, capturing stdout and stderr.
CommandResult Kregctl(const std::vector<std::string>& args);

// A kregd process: <dir>/k.sock, state <dir>/state, allowed root
// <dir>/modules (created; the kernels are copied there).
class Daemon {
 public:
  explicit Daemon(std::string dir, std::vector<std::string> extra_args = {});
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Starts kregd and waits until its health check passes (fails the test
  // otherwise).
  void Start();
  // SIGTERM and wait; returns the exit status (WEXITSTATUS or 128+signal).
  int Stop();
  // SIGKILL and wait.
  void Kill();

  const std::string& socket() const { return socket_; }
  std::string state_dir() const { return dir_ + "/state"; }
  std::string modules_dir() const { return dir_ + "/modules"; }
  std::string log() const { return ReadFile(dir_ + "/kregd.log"); }
  pid_t pid() const { return pid_; }
  // Path of a kernel copied under the allowed root, e.g. "libdemo.so".
  std::string Kernel(const std::string& name) const;
  Client client() const { return Client(socket_); }

 private:
  const std::string dir_;
  const std::string socket_;
  const std::vector<std::string> extra_args_;
  pid_t pid_ = -1;
};

}  // namespace kreg::testing

#endif  // KREGD_TESTS_TESTING_DAEMON_FIXTURE_H_
