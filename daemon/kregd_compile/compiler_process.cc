#include "daemon/kregd_compile/compiler_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/base/files.h"

namespace kreg {

absl::StatusOr<CompilerRun> RunCompiler(const std::vector<std::string>& argv,
                                        const std::string& cwd,
                                        const ChildLimits& limits,
                                        double wall_s,
                                        const std::vector<std::string>& env,
                                        size_t max_output,
                                        volatile sig_atomic_t* running_group) {
  CompilerRun r;
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    return ErrnoError("pipe2");
  }
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(out[0]);
    ::close(out[1]);
    return ErrnoError("fork");
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::chdir(cwd.c_str()) != 0 || !ApplyChildLimits(limits)) {
      std::string m = absl::StrCat(
          "kregd-compile: cannot set up the compiler "
          "process: ",
          std::strerror(errno), "\n");
      WriteAll(2, m, "stderr").IgnoreError();
      ::_exit(127);
    }
    std::vector<char*> args, envp;
    for (const std::string& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    for (const std::string& e : env)
      envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    ::execve(args[0], args.data(), envp.data());
    std::string m = absl::StrCat("kregd-compile: cannot run ", argv[0], ": ",
                                 std::strerror(errno), "\n");
    WriteAll(2, m, "stderr").IgnoreError();
    ::_exit(127);
  }
  ::close(out[1]);
  ::setpgid(pid, pid);
  if (running_group != nullptr) *running_group = pid;
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(wall_s * 1000.0));
  char buf[65536];
  bool open = true;
  while (open) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) {
      r.timed_out = true;
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    ssize_t got = ::read(out[0], buf, sizeof(buf));
    if (got <= 0) {
      open = got < 0 && errno == EINTR;
      continue;
    }
    size_t room = max_output - std::min(max_output, r.output.size());
    r.output.append(buf, std::min(room, static_cast<size_t>(got)));
    if (static_cast<size_t>(got) > room) r.truncated = true;
  }
  // The compiler's whole group: cc1plus, as and ld outlive the driver when
  // it is killed.
  ::kill(-pid, SIGKILL);
  if (running_group != nullptr) *running_group = 0;
  ::close(out[0]);
  rusage ru{};
  while (::wait4(pid, &r.status, 0, &ru) < 0 && errno == EINTR) {
  }
  r.cpu_s = ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
            (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
  return r;
}

std::string LimitHit(const CompilerRun& r, const v1::CompileLimits& l) {
  if (r.timed_out) return "compile_timeout_s";
  const int sig = WIFSIGNALED(r.status) ? WTERMSIG(r.status) : 0;
  const std::string& o = r.output;
  // A compiler process killed at the hard CPU limit says only "Killed".
  if (sig == SIGXCPU || absl::StrContains(o, "CPU time limit exceeded") ||
      (l.cpu_s() > 0 && r.cpu_s + 0.05 >= static_cast<double>(l.cpu_s()))) {
    return "compile_cpu_s";
  }
  if (sig == SIGXFSZ || absl::StrContains(o, "File size limit exceeded") ||
      absl::StrContains(o, "No space left on device")) {
    return "compile_output_bytes";
  }
  if (absl::StrContains(o, "memory exhausted") ||
      absl::StrContains(o, "out of memory") ||
      absl::StrContains(o, "Cannot allocate memory") ||
      absl::StrContains(o, "std::bad_alloc")) {
    return "compile_memory_bytes";
  }
  if (absl::StrContains(o, "Resource temporarily unavailable")) {
    return "compile_max_processes";
  }
  return "";
}

std::string LimitText(const std::string& key, const v1::CompileLimits& l) {
  if (key == "compile_timeout_s") {
    return absl::StrCat("the wall-clock limit of ", l.wall_s(), " s");
  }
  if (key == "compile_cpu_s") {
    return absl::StrCat("the CPU time limit of ", l.cpu_s(), " s");
  }
  if (key == "compile_output_bytes") {
    return absl::StrCat("the output size limit of ", l.output_bytes(),
                        " bytes");
  }
  if (key == "compile_memory_bytes") {
    return absl::StrCat("the memory limit of ", l.memory_bytes(), " bytes");
  }
  return absl::StrCat("the process limit of ", l.processes(),
                      " processes at once");
}

}  // namespace kreg
