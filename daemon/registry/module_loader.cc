#include "daemon/registry/module_loader.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "common/unique_fd.h"
#include "daemon/base/files.h"
#include "daemon/base/hosted_api.h"
#include "spdlog/spdlog.h"

extern char** environ;

namespace kreg {

namespace {

// Reads the child's stdout until EOF or the deadline.
std::string ReadReport(int fd, double timeout_s, bool* timed_out) {
  std::string out;
  auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0));
  char buf[4096];
  while (true) {
    int left =
        static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                             deadline - std::chrono::steady_clock::now())
                             .count());
    if (left <= 0) {
      *timed_out = true;
      return out;
    }
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, left);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return out;
    if (out.size() < 65536) out.append(buf, static_cast<size_t>(n));
  }
}

}  // namespace

absl::StatusOr<HandlerInfo> ProbeHandler(const std::string& probe_binary,
                                         const std::string& module_path,
                                         const std::string& display_name,
                                         const std::string& symbol,
                                         double timeout_s) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return ErrnoError("cannot create probe pipe");
  }
  UniqueFd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), STDOUT_FILENO);
  std::vector<std::string> argv_s = {probe_binary, module_path, symbol};
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, probe_binary.c_str(), &actions, nullptr,
                         argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("cannot start the probe helper ",
                                            probe_binary, ": ",
                                            std::strerror(rc)));
  }
  write_end.reset();
  bool timed_out = false;
  std::string report = ReadReport(read_end.get(), timeout_s, &timed_out);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  // `symbol` is a function or a handler bundle (common/handler_spec.h).
  const bool bundle = symbol.find('=') != std::string::npos;
  std::string what = absl::StrCat(bundle ? "handler bundle \"" : "symbol \"",
                                  symbol, "\" in module ", display_name);
  if (timed_out) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loading ", what, " did not finish within ", timeout_s,
        " s (probe_timeout_s): a library constructor or the handler hangs, "
        "or is that slow; not registered"));
  }
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    return absl::InvalidArgumentError(absl::StrCat(
        "loading and querying ", what, " crashed the probe helper (signal ",
        sig, ", ", strsignal(sig),
        "): the library's constructors crash or the symbol is not an XLA FFI "
        "handler; not registered"));
  }
  // Report lines: "ok <major> <minor> <traits> <state_type_id>" or
  // "error <absl code> <message>".
  absl::string_view line = absl::StripTrailingAsciiWhitespace(report);
  if (absl::ConsumePrefix(&line, "ok ")) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
    HandlerInfo info;
    int64_t state = 0;
    if (f.size() == 4 && absl::SimpleAtoi(f[0], &info.api_major) &&
        absl::SimpleAtoi(f[1], &info.api_minor) &&
        absl::SimpleAtoi(f[2], &info.traits) &&
        absl::SimpleAtoi(f[3], &state)) {
      info.state_type_id = state;
      return info;
    }
  } else if (absl::ConsumePrefix(&line, "error ")) {
    std::pair<absl::string_view, absl::string_view> parts =
        absl::StrSplit(line, absl::MaxSplits(' ', 1));
    int code = 0;
    if (absl::SimpleAtoi(parts.first, &code) && code > 0 && code < 17) {
      // Whatever the handler or the loader said (a missing symbol too), the
      // input is not something kregd can host: an invalid argument.
      auto out = absl::StatusCode::kInvalidArgument;
      std::string hint;
      if (absl::StrContains(parts.second, "Types used by FFI handlers")) {
        hint = bundle
                   ? " (name the state type the instantiate stage creates: "
                     "state_type=NAME/TYPE_ID_SYMBOL/TYPE_INFO_SYMBOL, "
                     "kregctl register --state-type)"
                   : " (an instantiate-stage handler: register it as the "
                     "instantiate stage of a handler bundle with its state "
                     "type, e.g. kregctl register --function instantiate=SYM "
                     "--function execute=SYM --state-type NAME/ID/INFO)";
      }
      return absl::Status(out, absl::StrCat(what, ": ", parts.second, hint));
    }
  }
  return absl::InternalError(
      absl::StrCat("the probe helper for ", what, " exited with status ",
                   WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                   " and an unreadable report: \"", line.substr(0, 200), "\""));
}

absl::Status CheckHostable(const HandlerInfo& info, const std::string& symbol,
                           bool has_instantiate) {
  if (info.api_major != static_cast<uint32_t>(kHostedApiMajor) ||
      info.api_minor > static_cast<uint32_t>(kHostedApiMinor)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "handler \"", symbol, "\" was built against XLA FFI API ",
        info.api_major, ".", info.api_minor, ", newer than the ",
        kHostedApiMajor, ".", kHostedApiMinor,
        " that kregd hosts; rebuild it against jaxlib 0.11.2's FFI headers "
        "or upgrade kregd"));
  }
  if (info.state_type_id != 0 && !has_instantiate) {
    return absl::InvalidArgumentError(absl::StrCat(
        "handler \"", symbol,
        "\" keeps per-instance state (an instantiate-stage handler with state "
        "type id ",
        info.state_type_id,
        "); register it as the instantiate stage of a handler bundle "
        "(instantiate=",
        symbol, ";execute=SYMBOL)"));
  }
  return absl::OkStatus();
}

ModuleLoader::ModuleLoader(ModuleStore* store, std::string probe_binary,
                           double probe_timeout_s)
    : store_(store),
      probe_binary_(std::move(probe_binary)),
      probe_timeout_s_(probe_timeout_s) {}

absl::StatusOr<StagedModule> ModuleLoader::Stage(const std::string& bytes,
                                                 const std::string& digest) {
  StagedModule staged{digest, store_->PathOf(digest), false};
  if (store_->Verify(digest).ok()) return staged;
  KREG_ASSIGN_OR_RETURN(staged.path, store_->WriteTemp(bytes, digest));
  staged.fresh = true;
  return staged;
}

absl::Status ModuleLoader::Commit(const StagedModule& staged) {
  if (!staged.fresh) return absl::OkStatus();
  return store_->CommitTemp(staged.path, staged.digest);
}

void ModuleLoader::Discard(const StagedModule& staged) {
  if (!staged.fresh) return;
  if (::unlink(staged.path.c_str()) != 0 && errno != ENOENT) {
    spdlog::warn(
        "cannot remove {} of a registration that was not accepted: "
        "{} (kregctl gc will retry)",
        staged.path, std::strerror(errno));
  }
}

absl::StatusOr<GcOutcome> ModuleLoader::RemoveUnreferenced(
    const std::set<std::string>& keep) {
  GcOutcome out;
  KREG_RETURN_IF_ERROR(
      store_->RemoveUnreferenced(keep, &out.files_removed, &out.bytes_removed,
                                 &out.files_kept, &out.bytes_kept));
  return out;
}

absl::StatusOr<HandlerInfo> ModuleLoader::Probe(const StagedModule& staged,
                                                const std::string& func_name) {
  KREG_ASSIGN_OR_RETURN(HandlerInfo info,
                        ProbeHandler(probe_binary_, staged.path, staged.digest,
                                     func_name, probe_timeout_s_));
  KREG_RETURN_IF_ERROR(CheckHostable(
      info, func_name, absl::StrContains(func_name, "instantiate=")));
  return info;
}

absl::Status ModuleLoader::Check(const std::string& digest) {
  if (::access(store_->PathOf(digest).c_str(), R_OK) != 0) {
    return ErrnoError(
        absl::StrCat("the store copy of module ", digest, " is not readable"));
  }
  return absl::OkStatus();
}

absl::Status ModuleLoader::CheckStored(const std::string& digest) {
  return store_->Verify(digest);
}

}  // namespace kreg
