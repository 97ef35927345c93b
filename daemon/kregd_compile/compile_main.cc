// kregd-compile: compiles one CompileJob (proto/kreg/v1/compile.proto) read
// from stdin and writes one CompileJobResult to stdout (DESIGN §13,
// docs/operator-guide.md "The compile service"). Started by kregd only
// (posix_spawn), once per compile; kregd never runs a compiler itself.
//
// As root it enters its sandbox (sandbox.h), takes the caller's
// credentials, refuses new privileges and installs its seccomp filter
// before it writes a byte of the caller's sources; the compiler then runs in
// its own process group under the job's limits, killed at the wall-clock limit.
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/base/files.h"
#include "daemon/base/hardening.h"
#include "daemon/kregd_compile/compiler_process.h"
#include "daemon/kregd_compile/sandbox.h"
#include "kreg/v1/compile.pb.h"

namespace kreg {
namespace {

constexpr size_t kMaxJobBytes = 16u << 20;
constexpr size_t kMaxDiagnosticsBytes = 1u << 20;
constexpr char kScratch[] = "/tmp";  // the sandbox's tmpfs

// The compiler's process group while it runs. kregd ends a worker it gives
// up on (shutdown, its own deadline) with SIGTERM, and a worker whose kregd
// died gets SIGTERM too (the parent-death signal): the handler takes the
// compiler's whole group along (cc1plus, as and ld are not the worker's
// children, so they would outlive a SIGKILLed worker).
volatile sig_atomic_t g_compiler_group = 0;
// In a sandboxed worker's parent: its child, PID 1 of the compile's PID
// namespace (EnterOwnPidNamespace); killing it ends the whole namespace.
volatile sig_atomic_t g_namespace_init = 0;

void OnTerm(int) {
  const pid_t group = g_compiler_group;
  if (group > 0) ::kill(-group, SIGKILL);
  const pid_t init = g_namespace_init;
  if (init > 0) ::kill(init, SIGKILL);
  ::_exit(128 + SIGTERM);
}

// A scratch directory to remove before answering (not sandboxed: the
// sandbox's tmpfs goes with its mount namespace).
std::string g_remove_scratch;

int RemoveOne(const char* path, const struct stat*, int, FTW*) {
  ::remove(path);
  return 0;
}

[[noreturn]] void Answer(const v1::CompileJobResult& r) {
  if (!g_remove_scratch.empty()) {
    ::nftw(g_remove_scratch.c_str(), RemoveOne, 16, FTW_DEPTH | FTW_PHYS);
  }
  WriteAll(1, r.SerializeAsString(), "stdout").IgnoreError();
  ::_exit(0);
}

[[noreturn]] void Fail(int code, const std::string& message,
                       const std::string& note = "") {
  v1::CompileJobResult r;
  r.set_code(code);
  r.set_message(message);
  r.set_note(note);
  Answer(r);
}

bool WriteFile(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  const bool ok = WriteAll(fd, text, path).ok();
  return ::close(fd) == 0 && ok;
}

// mkdir -p of the directories of a header's relative path under `root`.
bool MakeParents(const std::string& root, const std::string& rel) {
  for (size_t i = rel.find('/'); i != std::string::npos;
       i = rel.find('/', i + 1)) {
    std::string dir = root + "/" + rel.substr(0, i);
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return false;
  }
  return true;
}

std::string Trim(const std::string& s) {
  size_t end = s.find_last_not_of(" \n\r\t");
  return end == std::string::npos ? "" : s.substr(0, end + 1);
}

// Identity: the compiler's real path, `--version` and target arch (the
// cache key covers it: a compiler upgrade is a new key).
[[noreturn]] void Identity(const v1::CompileJob& job) {
  char real[PATH_MAX];
  if (::realpath(job.compiler().c_str(), real) == nullptr) {
    Fail(5, absl::StrCat("the compiler ", job.compiler(),
                         " cannot be found: ", std::strerror(errno)));
  }
  const std::vector<std::string> env = {"PATH=/usr/local/bin:/usr/bin:/bin",
                                        "LANG=C", "LC_ALL=C"};
  ChildLimits limits{30, 0, 0, 0};
  absl::StatusOr<CompilerRun> version = RunCompiler(
      {real, "--version"}, "/", limits, 30, env, kMaxDiagnosticsBytes);
  if (!version.ok()) Fail(13, std::string(version.status().message()));
  if (!WIFEXITED(version->status) || WEXITSTATUS(version->status) != 0) {
    Fail(9, absl::StrCat(real, " --version failed: ", Trim(version->output)));
  }
  std::string arch;
  if (absl::StrContains(real, "nvcc")) {
    utsname u{};
    ::uname(&u);
    arch = u.machine;
  } else {
    absl::StatusOr<CompilerRun> m = RunCompiler(
        {real, "-dumpmachine"}, "/", limits, 30, env, kMaxDiagnosticsBytes);
    if (m.ok()) arch = Trim(m->output);
  }
  v1::CompileJobResult r;
  r.set_identity(absl::StrCat(real, "\n", Trim(version->output), "\n", arch));
  Answer(r);
}

// FAILED_PRECONDITION: the host, not the sources (operator guide, "The
// compile service").
[[noreturn]] void SandboxFailed(const absl::Status& s) {
  Fail(9, absl::StrCat(
              "the compile sandbox could not be set up (", s.message(),
              "); kregd needs CAP_SYS_ADMIN and mount, network, IPC and PID "
              "namespaces for it (kregd.service: CAP_SYS_ADMIN in "
              "CapabilityBoundingSet=, RestrictNamespaces=mnt net ipc pid)"));
}

// The compile's scratch directory: the sandbox's private tmpfs (root) or a
// fresh temporary directory (kregd is not root); `*note` says which.
// Exits with an answer when it cannot be made.
std::string EnterScratch(const v1::CompileJob& job, std::string* note) {
  const v1::CompileLimits& l = job.limits();
  if (job.sandbox()) {
    absl::Status s = EnterSandbox(kScratch, l.output_bytes() * 2 + (64u << 20),
                                  job.uid(), job.gid());
    if (!s.ok()) SandboxFailed(s);
    *note = "sandboxed";
    return kScratch;
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl =
      absl::StrCat(tmp && *tmp ? tmp : "/tmp", "/kregd-compile-XXXXXX");
  if (::mkdtemp(tmpl.data()) == nullptr) {
    Fail(13, absl::StrCat("mkdtemp ", tmpl, ": ", std::strerror(errno)));
  }
  g_remove_scratch = tmpl;
  *note = "not sandboxed (kregd is not root)";
  return tmpl;
}

// The sandbox's own PID namespace with a proc of its own: the worker forks;
// the child, PID 1 there, goes on to compile and answers; the parent keeps
// no descriptor of kregd's, waits for it and exits as it did (kregd's
// SIGTERM to the parent ends the namespace: OnTerm).
void EnterOwnPidNamespace() {
  absl::StatusOr<pid_t> child = ForkIntoPidNamespace();
  if (!child.ok()) SandboxFailed(child.status());
  if (*child == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (absl::Status s = MountOwnProc(); !s.ok()) SandboxFailed(s);
    return;
  }
  g_namespace_init = *child;
  ::close(0);
  ::close(1);
  int ws = 0;
  while (::waitpid(*child, &ws, 0) < 0 && errno == EINTR) {
  }
  ::_exit(WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws));
}

// The caller's credentials (when kregd runs as root) and no new
// privileges; appends whose uid the compile runs as to `*note`.
void BecomeCaller(const v1::CompileJob& job, std::string* note) {
  if (job.drop_privileges()) {
    std::vector<gid_t> groups(job.groups().begin(), job.groups().end());
    absl::Status s = DropPrivileges(job.uid(), job.gid(), groups);
    if (!s.ok()) Fail(7, std::string(s.message()));
    absl::StrAppend(note, ", as uid ", job.uid());
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // the uid switch cleared it
  } else {
    absl::StrAppend(note, ", as kregd's uid ", ::geteuid());
  }
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
    Fail(13, absl::StrCat("PR_SET_NO_NEW_PRIVS: ", std::strerror(errno)));
  }
}

// Writes the job's sources and headers under `src`. Names are checked by
// kregd (compile_request.h): plain names and relative paths without "."
// or "..". A full scratch is compile_output_bytes' RESOURCE_EXHAUSTED.
// Writes the sources and headers into `src`, and the XLA FFI headers into
// `ffi` (its own directory, so no caller's file name can replace them).
void WriteInputs(const v1::CompileJob& job, const std::string& src,
                 const std::string& ffi, const std::string& note) {
  for (int kind = 0; kind < 3; ++kind) {
    const std::string& root = kind == 2 ? ffi : src;
    for (const v1::SourceFile& f : kind == 0   ? job.sources()
                                   : kind == 1 ? job.headers()
                                               : job.ffi_headers()) {
      if (MakeParents(root, f.name()) &&
          WriteFile(root + "/" + f.name(), f.text())) {
        continue;
      }
      std::string why = std::strerror(errno);
      bool full = errno == ENOSPC || errno == EFBIG;
      v1::CompileJobResult r;
      r.set_code(full ? 8 : 13);
      r.set_limit(full ? "compile_output_bytes" : "");
      r.set_message(
          absl::StrCat("cannot write ", f.name(),
                       " into the compile's scratch directory: ", why));
      r.set_note(note);
      Answer(r);
    }
  }
}

// The compiler's failure as the result's code and message: a limit it hit
// (RESOURCE_EXHAUSTED naming the key), else the sources (INVALID_ARGUMENT).
void DescribeFailure(const CompilerRun& run, const v1::CompileLimits& l,
                     v1::CompileJobResult* r) {
  std::string limit = LimitHit(run, l);
  if (!limit.empty()) {
    r->set_code(8);  // RESOURCE_EXHAUSTED
    r->set_limit(limit);
    r->set_message(
        absl::StrCat("it hit ", LimitText(limit, l), " (", limit, ")"));
    return;
  }
  r->set_code(3);  // INVALID_ARGUMENT: the sources do not compile
  r->set_message(WIFEXITED(run.status)
                     ? absl::StrCat("the compiler failed (exit status ",
                                    WEXITSTATUS(run.status), ")")
                     : absl::StrCat("the compiler was killed by signal ",
                                    WTERMSIG(run.status)));
}

[[noreturn]] void Compile(const v1::CompileJob& job) {
  const v1::CompileLimits& l = job.limits();
  std::string note;
  // RLIMIT_NPROC counts every task of the uid on the host: counted while
  // /proc is still the host's.
  const uint64_t tasks =
      TasksOfUid(job.drop_privileges() ? job.uid() : ::getuid());
  const std::string scratch = EnterScratch(job, &note);
  if (job.sandbox()) EnterOwnPidNamespace();
  BecomeCaller(job, &note);
  if (absl::Status s = InstallCompilerSeccompFilter(); !s.ok()) {
    Fail(13, std::string(s.message()), note);
  }
  const std::string src = scratch + "/src";
  const std::string tmp = scratch + "/tmp";
  const std::string ffi = scratch + "/ffi-include";
  for (const std::string& dir : {src, tmp, ffi}) {
    if (::mkdir(dir.c_str(), 0700) != 0) {
      Fail(13, absl::StrCat("mkdir ", dir, ": ", std::strerror(errno)), note);
    }
  }
  WriteInputs(job, src, ffi, note);
  const std::string output = scratch + "/out.so";
  std::vector<std::string> argv = {job.compiler()};
  for (const std::string& a : job.base_args()) argv.push_back(a);
  // -isystem: the XLA FFI headers' own warnings are not the caller's.
  argv.insert(argv.end(), {"-isystem", ffi});
  for (const std::string& o : job.options()) argv.push_back(o);
  for (const v1::SourceFile& f : job.sources()) argv.push_back(f.name());
  argv.push_back("-o");
  argv.push_back(output);
  const std::vector<std::string> env = {
      "PATH=/usr/local/cuda/bin:/usr/local/bin:/usr/bin:/bin", "LANG=C",
      "LC_ALL=C", "TMPDIR=" + tmp, "HOME=" + scratch};
  ChildLimits limits;
  limits.cpu_s = l.cpu_s();
  limits.memory_bytes = l.memory_bytes();
  limits.output_bytes = l.output_bytes();
  // Allow what the uid ran before, this worker and the compile's own
  // processes.
  limits.nproc = l.processes() == 0 ? 0 : tasks + 1 + l.processes();
  absl::StatusOr<CompilerRun> ran =
      RunCompiler(argv, src, limits, l.wall_s(), env, kMaxDiagnosticsBytes,
                  &g_compiler_group);
  if (!ran.ok()) Fail(13, std::string(ran.status().message()), note);
  const CompilerRun& run = *ran;
  v1::CompileJobResult r;
  r.set_note(note);
  r.set_diagnostics(run.output);
  if (run.truncated) {
    r.mutable_diagnostics()->append(
        absl::StrCat("\n[kregd: diagnostics truncated at ",
                     kMaxDiagnosticsBytes, " bytes]\n"));
  }
  if (run.timed_out || !WIFEXITED(run.status) || WEXITSTATUS(run.status) != 0) {
    DescribeFailure(run, l, &r);
    Answer(r);
  }
  std::string module;
  int fd = ::open(output.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0 || !ReadAll(fd, &module, l.output_bytes(), "the module").ok()) {
    r.set_code(13);
    r.set_message(
        absl::StrCat("the compiler succeeded but left no readable "
                     "shared library (an -o option in the "
                     "options?): ",
                     std::strerror(errno)));
    Answer(r);
  }
  r.set_module(std::move(module));
  Answer(r);
}

}  // namespace
}  // namespace kreg

int main() {
  // stdin: the job; stdout: the result; stderr: kregd's log.
  kreg::CloseDescriptorsFrom(3);
  struct sigaction term {};
  term.sa_handler = kreg::OnTerm;
  ::sigaction(SIGTERM, &term, nullptr);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  std::string bytes;
  kreg::v1::CompileJob job;
  if (!kreg::ReadAll(0, &bytes, kreg::kMaxJobBytes, "stdin").ok() ||
      !job.ParseFromString(bytes)) {
    kreg::Fail(3, "kregd-compile: unreadable job on stdin (kregd starts it)");
  }
  if (job.identity_only()) {
    if (job.drop_privileges()) {
      std::vector<gid_t> groups = {job.gid()};
      absl::Status s = kreg::DropPrivileges(job.uid(), job.gid(), groups);
      if (!s.ok()) kreg::Fail(7, std::string(s.message()));
    }
    kreg::Identity(job);
  }
  kreg::Compile(job);
}
