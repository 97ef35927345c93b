// kregd: out-of-process kernel registry and executor for JAX's XLA FFI.
#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>

#include "daemon/base/log_format.h"
#include "daemon/base/log_limit.h"
#include "daemon/config/config.h"
#include "daemon/kregd/server.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace {

// Every session, control, watch and gRPC connection is a descriptor or
// three of kregd's, and none a thread (docs/design.md §14), so descriptors
// are what bounds them: the soft RLIMIT_NOFILE is raised to the hard one
// (systemd's default soft limit, 1024, is below what max_sessions needs),
// with a warning when even that is short of the configured limits.
void RaiseFileLimit(const kreg::Config& c) {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  const rlim_t before = rl.rlim_cur;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) rl.rlim_cur = before;
  }
  // A session holds 3 (its socket, its executor's broker socket and the
  // copy kregd waits on), a gRPC connection 2.
  const uint64_t need = 3ull * static_cast<uint64_t>(c.max_sessions) +
                        2ull * static_cast<uint64_t>(c.max_grpc_connections) +
                        256;
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
    spdlog::warn(
        "the open-file limit is {} (hard limit {}), below the {} that "
        "max_sessions ({}) and max_grpc_connections ({}) may need: kregd "
        "pauses accepting when it runs out; raise LimitNOFILE in the unit "
        "or lower those limits",
        rl.rlim_cur, rl.rlim_max, need, c.max_sessions, c.max_grpc_connections);
  } else if (rl.rlim_cur != before) {
    spdlog::info("open-file limit raised from {} to {}", before, rl.rlim_cur);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Module uploads are buffered by gRPC and session threads: with a fixed
  // mmap threshold every large buffer is its own mapping, unmapped when
  // freed, so kregd's RSS goes back down after a burst (glibc's dynamic
  // threshold would keep them in the threads' arenas).
  ::mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  ::mallopt(M_TRIM_THRESHOLD, 1 << 20);
  bool exit_now = false;
  absl::StatusOr<kreg::Config> config =
      kreg::ParseConfig(argc, argv, &exit_now);
  if (!config.ok()) {
    std::fprintf(stderr, "kregd: %s\n",
                 std::string(config.status().message()).c_str());
    return 2;
  }
  if (exit_now) return 0;
  spdlog::set_default_logger(spdlog::stderr_color_mt("kregd"));
  spdlog::set_level(spdlog::level::from_str(config->log_level));
  kreg::SetLogFormat("kregd");
  kreg::RouteProtobufLogs();  // rate-limited, into this log
  RaiseFileLimit(*config);

  // Signals are taken synchronously by this thread only.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  kreg::Daemon daemon(*config);
  absl::Status st = daemon.Start();
  if (!st.ok()) {
    spdlog::critical("cannot start: {}", std::string(st.message()));
    return 1;
  }
  int sig = 0;
  while (sigwait(&signals, &sig) == 0 && sig == SIGHUP) {
    spdlog::warn(
        "SIGHUP: kregd does not reload its configuration; restart it to apply "
        "a change (systemctl restart kregd: executors keep serving their "
        "sessions), after checking it with kregd --check-config");
  }
  spdlog::info("received signal {}; shutting down", sig);
  daemon.Shutdown();
  if (daemon.left_executors()) {
    // Threads still wait for the executors left running; destroying the
    // daemon under them would pull their state away. End here.
    spdlog::default_logger()->flush();
    std::fflush(nullptr);
    ::_exit(0);
  }
  return 0;
}
