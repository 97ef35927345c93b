#include "daemon/compile_service/compile_worker.h"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/unique_fd.h"
#include "daemon/base/files.h"
#include "daemon/base/spawn.h"

extern char** environ;

namespace kreg {
namespace {

bool KnownLimit(const std::string& limit) {
  for (const char* k :
       {"", "compile_timeout_s", "compile_cpu_s", "compile_memory_bytes",
        "compile_output_bytes", "compile_max_processes"}) {
    if (limit == k) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<v1::CompileJobResult> DecodeWorkerResult(
    const std::string& bytes, uint64_t max_module_bytes) {
  if (bytes.size() > max_module_bytes + kMaxWorkerDiagnosticsBytes + 65536) {
    return absl::InternalError(
        absl::StrCat("the compile worker answered ", bytes.size(),
                     " bytes, more than a "
                     "module of compile_output_bytes and its diagnostics"));
  }
  v1::CompileJobResult r;
  if (bytes.empty() || !r.ParseFromString(bytes)) {
    return absl::InternalError(
        "the compile worker's answer is not a CompileJobResult");
  }
  if (r.code() < 0 || r.code() > 16) {
    return absl::InternalError(
        absl::StrCat("the compile worker answered status code ", r.code()));
  }
  if (r.module().size() > max_module_bytes) {
    return absl::InternalError(absl::StrCat(
        "the compile worker returned a module of ", r.module().size(),
        " bytes, over compile_output_bytes (", max_module_bytes, ")"));
  }
  if (r.diagnostics().size() > kMaxWorkerDiagnosticsBytes ||
      r.message().size() > 4096 || r.note().size() > 4096 ||
      r.identity().size() > 65536) {
    return absl::InternalError(
        "the compile worker's diagnostics or messages are over their limits");
  }
  if (!KnownLimit(r.limit())) {
    return absl::InternalError("the compile worker named an unknown limit");
  }
  if ((r.code() == 0) != (!r.module().empty() || !r.identity().empty())) {
    return absl::InternalError(
        "the compile worker answered a module with a failure, or neither");
  }
  return r;
}

absl::StatusOr<v1::CompileJobResult> RunCompileWorker(
    const std::string& binary, const v1::CompileJob& job,
    std::chrono::milliseconds timeout, uint64_t max_module_bytes,
    const std::function<bool()>& cancelled) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return ErrnoError("socketpair");
  }
  UniqueFd ours(sv[0]);
  UniqueFd theirs(sv[1]);
  // A plain environment (the worker sets the compiler's own): where its
  // libraries are, its scratch directory, sanitizer settings.
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "TMPDIR=", 7) == 0 ||
        std::strncmp(*e, "LD_LIBRARY_PATH=", 16) == 0 ||
        std::strncmp(*e, "ASAN_OPTIONS=", 13) == 0 ||
        std::strncmp(*e, "UBSAN_OPTIONS=", 14) == 0 ||
        std::strncmp(*e, "LSAN_OPTIONS=", 13) == 0) {
      env.push_back(*e);
    }
  }
  env.push_back(nullptr);
  pid_t pid = 0;
  int rc = SpawnInOwnGroup(binary, {{theirs.get(), 0}, {theirs.get(), 1}},
                           env.data(), &pid);
  theirs.reset();
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot start the compile worker ", binary, ": ", strerror(rc),
        " (install kregd-compile next to kregd or set compile_binary)"));
  }
  // Ending a worker: SIGTERM, on which it ends its compiler's process
  // group (compile_main.cc), then SIGKILL after two seconds.
  auto reap = [pid](bool kill) {
    int ws = 0;
    if (kill) {
      ::kill(pid, SIGTERM);
      for (int i = 0; i < 200; ++i) {
        pid_t r = ::waitpid(pid, &ws, WNOHANG);
        if (r == pid) return ws;
        if (r < 0 && errno != EINTR) return ws;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      ::kill(pid, SIGKILL);
    }
    while (::waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
    }
    return ws;
  };
  std::string out;
  job.SerializeToString(&out);
  size_t sent = 0;
  while (sent < out.size()) {
    ssize_t n =
        ::send(ours.get(), out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // it died: its answer (none) says so below
    sent += static_cast<size_t>(n);
  }
  ::shutdown(ours.get(), SHUT_WR);
  const size_t cap = max_module_bytes + kMaxWorkerDiagnosticsBytes + 65536;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string answer;
  std::vector<char> buf(1 << 16);
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) {
      reap(true);
      return absl::DeadlineExceededError(absl::StrCat(
          "the compile worker (pid ", pid, ") did not answer within ",
          timeout.count() / 1000.0, " s; it was killed"));
    }
    if (cancelled && cancelled()) {
      reap(true);
      return absl::CancelledError(
          absl::StrCat("kregd is shutting down; the compile worker (pid ", pid,
                       ") was stopped. Compile again once kregd is back"));
    }
    pollfd p{ours.get(), POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (n <= 0) continue;
    ssize_t got = ::read(ours.get(), buf.data(), buf.size());
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    if (answer.size() + static_cast<size_t>(got) > cap) {
      reap(true);
      return absl::InternalError(absl::StrCat("the compile worker (pid ", pid,
                                              ") answered more than ", cap,
                                              " bytes; it was killed"));
    }
    answer.append(buf.data(), static_cast<size_t>(got));
  }
  int ws = reap(false);
  if (answer.empty()) {
    return absl::UnavailableError(absl::StrCat(
        "the compile worker (pid ", pid, ") ended without an answer (",
        WIFSIGNALED(ws) ? absl::StrCat("signal ", WTERMSIG(ws))
                        : absl::StrCat("exit status ", WEXITSTATUS(ws)),
        "); kregd's log has its output"));
  }
  return DecodeWorkerResult(answer, max_module_bytes);
}

}  // namespace kreg
