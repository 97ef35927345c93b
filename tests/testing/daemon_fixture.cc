#include "tests/testing/daemon_fixture.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "catch2/catch.hpp"

extern char** environ;

namespace kreg::testing {
namespace {}  // namespace

int WaitExit(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

pid_t Spawn(const std::vector<std::string>& args, const std::string& out,
            const std::string& err) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&actions, 2, err.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0600);
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  int rc =
      ::posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  // No Catch2 assertion here: Run() and Kregctl() are called from test
  // threads, and Catch2's assertion macros are not thread-safe (TSan reports
  // its RunContext as raced). The callers check the pid.
  if (rc != 0) {
    std::ofstream(err, std::ios::app)
        << "posix_spawn " << args[0] << ": " << std::strerror(rc) << "\n";
    return -1;
  }
  return pid;
}

namespace {

std::string TempFile(const std::string& tag) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string tmpl =
      std::string(base ? base : "/tmp") + "/kregctl-" + tag + "-XXXXXX";
  int fd = ::mkstemp(tmpl.data());
  ::close(fd);
  return tmpl;
}

}  // namespace

std::string Runfile(const std::string& relative) {
  return std::filesystem::absolute(relative).string();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
}

CommandResult Kregctl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {Runfile("client/kregctl/kregctl")};
  argv.insert(argv.end(), args.begin(), args.end());
  return Run(argv);
}

CommandResult Run(const std::vector<std::string>& argv) {
  std::string out = TempFile("out"), err = TempFile("err");
  CommandResult r;
  pid_t pid = Spawn(argv, out, err);
  r.exit_code = pid > 0 ? WaitExit(pid) : 127;
  r.out = ReadFile(out);
  r.err = ReadFile(err);
  ::unlink(out.c_str());
  ::unlink(err.c_str());
  return r;
}

Daemon::Daemon(std::string dir, std::vector<std::string> extra_args)
    : dir_(std::move(dir)),
      socket_(dir_ + "/k.sock"),
      extra_args_(std::move(extra_args)) {
  std::filesystem::create_directories(modules_dir());
  for (const char* name :
       {"libdemo.so", "libdemo_v2.so", "libnot_handler.so", "libcrash_ctor.so",
        "libhang_ctor.so", "libnewer_api.so", "libstateful.so", "libhostile.so",
        "libcounter_state.so"}) {
    std::string to = modules_dir() + "/" + name;
    if (!std::filesystem::exists(to)) {
      WriteFile(to, ReadFile(Runfile(std::string("kernels/cpu/") + name)));
      ::chmod(to.c_str(), 0644);
    }
  }
}

Daemon::~Daemon() {
  if (pid_ > 0) Kill();
}

std::string Daemon::Kernel(const std::string& name) const {
  return modules_dir() + "/" + name;
}

void Daemon::Start() {
  REQUIRE(pid_ < 0);
  std::vector<std::string> args = {Runfile("daemon/kregd/kregd"),
                                   "--socket",
                                   socket_,
                                   "--state-dir",
                                   state_dir(),
                                   "--allow-root",
                                   modules_dir()};
  args.insert(args.end(), extra_args_.begin(), extra_args_.end());
  std::string log = dir_ + "/kregd.log";
  pid_ = Spawn(args, "/dev/null", log);
  if (pid_ < 0) FAIL("kregd could not be started:\n" << ReadFile(log));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      FAIL("kregd exited during start-up:\n" << ReadFile(log));
    }
    if (::access(socket_.c_str(), F_OK) == 0 && client().Health().ok()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  FAIL("kregd did not become healthy within 20 s:\n" << ReadFile(log));
}

int Daemon::Stop() {
  REQUIRE(pid_ > 0);
  ::kill(pid_, SIGTERM);
  int code = WaitExit(pid_);
  pid_ = -1;
  return code;
}

void Daemon::Kill() {
  ::kill(pid_, SIGKILL);
  WaitExit(pid_);
  pid_ = -1;
}

}  // namespace kreg::testing
