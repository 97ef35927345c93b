// libhostile.so: handlers that misbehave on purpose, for the executor tests
// (DESIGN §8: a kernel that crashes, hangs or probes its rights must only
// hurt its own call). Not kernels to copy. Each takes one input of any type
// (ignored) and writes int64 results into an output of at least 4
// elements.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "kernels/cpu/export.h"
#include "xla/ffi/api/ffi.h"

namespace kreg::kernels {
namespace {

namespace ffi = xla::ffi;
using Out = ffi::Result<ffi::Buffer<ffi::S64>>;

ffi::Error NeedFour(Out& y) {
  if (y->element_count() < 4) {
    return ffi::Error::InvalidArgument(
        "hostile kernels write 4 int64 results; the output is smaller");
  }
  return ffi::Error::Success();
}

ffi::Error SegfaultImpl(ffi::AnyBuffer, Out y) {
  volatile int* p = nullptr;
  *p = 1;
  return NeedFour(y);
}

ffi::Error AbortImpl(ffi::AnyBuffer, Out y) {
  std::abort();
  return NeedFour(y);
}

ffi::Error Exit3Impl(ffi::AnyBuffer, Out y) {
  std::exit(3);
  return NeedFour(y);
}

ffi::Error ThrowImpl(ffi::AnyBuffer, Out y) {
  if (y->element_count() > 0) {
    throw std::runtime_error("hostile.Throw threw on purpose");
  }
  return NeedFour(y);
}

// Throws where nothing can catch it (ffi.h's wrapper turns an exception
// that leaves a handler into an error): std::terminate.
void ThrowFromNoexcept() noexcept {
  throw std::runtime_error("hostile.ThrowUncaught threw on purpose");
}

ffi::Error ThrowUncaughtImpl(ffi::AnyBuffer, Out y) {
  ThrowFromNoexcept();
  return NeedFour(y);
}

__attribute__((noinline)) int64_t Recurse(volatile int64_t depth) {
  volatile char frame[4096];
  frame[0] = static_cast<char>(depth);
  return Recurse(depth + 1) + frame[0];
}

ffi::Error StackOverflowImpl(ffi::AnyBuffer, Out y) {
  y->typed_data()[0] = Recurse(0);
  return NeedFour(y);
}

ffi::Error WriteFarImpl(ffi::AnyBuffer, Out y) {
  // 64 GiB past the output: unmapped in any process on this machine.
  volatile char* p =
      reinterpret_cast<char*>(y->typed_data()) + (int64_t{1} << 36);
  *p = 1;
  return NeedFour(y);
}

ffi::Error SpinImpl(ffi::AnyBuffer, Out y) {
  volatile uint64_t n = 0;
  for (;;) n = n + 1;
  return NeedFour(y);
}

// [uid, gid, pid, ppid]
ffi::Error WhoAmIImpl(ffi::AnyBuffer, Out y);

// Sleeps `ms` milliseconds, then answers as WhoAmI: a call that is still
// running when another session's handler crashes the executor.
ffi::Error NapImpl(ffi::AnyBuffer x, Out y, int64_t ms) {
  if (ms < 0 || ms > 60000) return ffi::Error::InvalidArgument("ms: 0..60000");
  struct timespec ts = {static_cast<time_t>(ms / 1000),
                        static_cast<long>(ms % 1000) * 1000000L};
  while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
  return WhoAmIImpl(x, y);
}

ffi::Error WhoAmIImpl(ffi::AnyBuffer, Out y) {
  if (ffi::Error e = NeedFour(y); e.failure()) return e;
  int64_t* out = y->typed_data();
  out[0] = ::getuid();
  out[1] = ::getgid();
  out[2] = ::getpid();
  out[3] = ::getppid();
  return ffi::Error::Success();
}

// [calls so far in this copy of the module, pid, 0, 0]
ffi::Error CounterImpl(ffi::AnyBuffer, Out y) {
  static int64_t calls = 0;
  if (ffi::Error e = NeedFour(y); e.failure()) return e;
  int64_t* out = y->typed_data();
  out[0] = calls++;
  out[1] = ::getpid();
  out[2] = out[3] = 0;
  return ffi::Error::Success();
}

// Each probe writes [rc, errno, 0, 0].
void Report(Out& y, int64_t rc, int err) {
  int64_t* out = y->typed_data();
  out[0] = rc;
  out[1] = rc < 0 ? err : 0;
  out[2] = out[3] = 0;
}

ffi::Error TryExecImpl(ffi::AnyBuffer, Out y) {
  if (ffi::Error e = NeedFour(y); e.failure()) return e;
  char arg0[] = "/bin/true";
  char* argv[] = {arg0, nullptr};
  char* envp[] = {nullptr};
  int rc = ::execve(arg0, argv, envp);
  Report(y, rc, errno);
  return ffi::Error::Success();
}

ffi::Error TryInetImpl(ffi::AnyBuffer, Out y) {
  if (ffi::Error e = NeedFour(y); e.failure()) return e;
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int err = errno;
  if (fd >= 0) ::close(fd);
  Report(y, fd, err);
  return ffi::Error::Success();
}

ffi::Error TryOpenImpl(ffi::AnyBuffer, Out y, std::string_view path) {
  if (ffi::Error e = NeedFour(y); e.failure()) return e;
  std::string p(path);
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  int err = errno;
  if (fd >= 0) ::close(fd);
  Report(y, fd, err);
  return ffi::Error::Success();
}

// Creates `path`.started, then waits (at most 60 s) until the file `path`
// exists: a call a test holds in flight for as long as it needs
// (tests/python/test_replace.py). Answers [calls so far in this copy of the
// module, pid, 0, 0].
ffi::Error GateImpl(ffi::AnyBuffer, Out y, std::string_view path) {
  static int64_t calls = 0;
  if (ffi::Error e = NeedFour(y); e.failure()) return e;
  const std::string gate(path);
  int fd =
      ::open((gate + ".started").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    return ffi::Error::Internal("hostile.Gate: cannot create " + gate +
                                ".started");
  ::close(fd);
  struct timespec ms = {0, 1000000L};
  for (int i = 0; i < 60000 && ::access(gate.c_str(), F_OK) != 0; ++i) {
    ::nanosleep(&ms, nullptr);
  }
  int64_t* out = y->typed_data();
  out[0] = calls++;
  out[1] = ::getpid();
  out[2] = 0;
  out[3] = 0;
  return ffi::Error::Success();
}

ffi::Error TryPtraceImpl(ffi::AnyBuffer, Out y, int64_t pid) {
  if (ffi::Error e = NeedFour(y); e.failure()) return e;
  long rc = ::ptrace(PTRACE_ATTACH, static_cast<pid_t>(pid), nullptr, nullptr);
  Report(y, rc, errno);
  return ffi::Error::Success();
}

// Fills every mapping of kregd's executor status page in this process
// (memfd "kreg-exec-status") with 0xff bytes: kregd must take what it reads
// there as untrusted. y[0] = bytes written, y[1] = mappings found.
ffi::Error ScribbleStatusImpl(ffi::AnyBuffer, Out y) {
  if (ffi::Error e = NeedFour(y); e.failure()) return e;
  int64_t bytes = 0;
  int64_t found = 0;
  if (FILE* maps = std::fopen("/proc/self/maps", "r")) {
    char line[512];
    while (std::fgets(line, sizeof(line), maps) != nullptr) {
      if (std::strstr(line, "kreg-exec-status") == nullptr) continue;
      unsigned long lo = 0;
      unsigned long hi = 0;
      char perms[8] = {};
      if (std::sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3) continue;
      if (perms[1] != 'w') continue;
      std::memset(reinterpret_cast<void*>(lo), 0xff, hi - lo);
      bytes += static_cast<int64_t>(hi - lo);
      ++found;
    }
    std::fclose(maps);
  }
  int64_t* out = y->typed_data();
  out[0] = bytes;
  out[1] = found;
  out[2] = out[3] = 0;
  return ffi::Error::Success();
}

// Sends `n` bytes of `chunk` (repeated) into `fd` without blocking for
// good: gives up when the socket takes nothing for a second. Returns the
// bytes sent; `*failed` is set when sending failed (the peer closed the
// socket, or the executor closed it under us as its session ended).
int64_t Flood(int fd, const std::vector<char>& chunk, int64_t n, bool* failed) {
  int64_t sent = 0;
  while (sent < n) {
    size_t want = static_cast<size_t>(
        std::min<int64_t>(n - sent, static_cast<int64_t>(chunk.size())));
    ssize_t w = ::send(fd, chunk.data(), want, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w > 0) {
      sent += w;
      continue;
    }
    if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, 1000) <= 0) break;  // stalled: nobody reads it
      continue;
    }
    *failed = true;
    break;
  }
  return sent;
}

// Writes into every Unix socket this executor holds to its parent (kregd:
// the broker socket of each session and the control socket) a frame header
// announcing `announce` bytes, then `send` bytes of payload. kregd must
// refuse such frames without buffering them. y = [sockets found, bytes
// sent, sockets that stopped taking bytes with an error, 1 once done].
ffi::Error FloodBrokersImpl(ffi::AnyBuffer, Out y, int64_t announce,
                            int64_t send) {
  if (ffi::Error e = NeedFour(y); e.failure()) return e;
  int64_t* out = y->typed_data();
  out[0] = out[1] = out[2] = out[3] = 0;
  const pid_t parent = ::getppid();
  std::vector<char> chunk(1 << 20, 'k');
  unsigned char header[4];
  for (int i = 0; i < 4; ++i) {
    header[i] = static_cast<unsigned char>((announce >> (8 * i)) & 0xff);
  }
  std::vector<int> fds;
  if (DIR* dir = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(dir)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      fds.push_back(std::atoi(e->d_name));
    }
    ::closedir(dir);
  }
  for (int fd : fds) {
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
        cred.pid != parent) {
      continue;
    }
    ++out[0];
    bool failed = false;
    std::vector<char> head(header, header + 4);
    if (Flood(fd, head, 4, &failed) == 4) {
      out[1] += Flood(fd, chunk, send, &failed);
    }
    if (failed) ++out[2];
  }
  __atomic_store_n(&out[3], 1, __ATOMIC_RELEASE);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace kreg::kernels

namespace ffi = xla::ffi;

KREG_EXPORT_HANDLER(Segfault);
KREG_EXPORT_HANDLER(Abort);
KREG_EXPORT_HANDLER(Exit3);
KREG_EXPORT_HANDLER(Throw);
KREG_EXPORT_HANDLER(ThrowUncaught);
KREG_EXPORT_HANDLER(StackOverflow);
KREG_EXPORT_HANDLER(WriteFar);
KREG_EXPORT_HANDLER(Spin);
KREG_EXPORT_HANDLER(WhoAmI);
KREG_EXPORT_HANDLER(Counter);
KREG_EXPORT_HANDLER(TryExec);
KREG_EXPORT_HANDLER(TryInet);
KREG_EXPORT_HANDLER(TryOpen);
KREG_EXPORT_HANDLER(TryPtrace);
KREG_EXPORT_HANDLER(Nap);
KREG_EXPORT_HANDLER(Gate);
KREG_EXPORT_HANDLER(ScribbleStatus);
KREG_EXPORT_HANDLER(FloodBrokers);

#define KREG_HOSTILE(name)             \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(       \
      name, kreg::kernels::name##Impl, \
      ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Ret<ffi::Buffer<ffi::S64>>())

KREG_HOSTILE(Segfault);
KREG_HOSTILE(Abort);
KREG_HOSTILE(Exit3);
KREG_HOSTILE(Throw);
KREG_HOSTILE(ThrowUncaught);
KREG_HOSTILE(StackOverflow);
KREG_HOSTILE(WriteFar);
KREG_HOSTILE(Spin);
KREG_HOSTILE(WhoAmI);
KREG_HOSTILE(Counter);
KREG_HOSTILE(TryExec);
KREG_HOSTILE(TryInet);
KREG_HOSTILE(ScribbleStatus);

XLA_FFI_DEFINE_HANDLER_SYMBOL(TryOpen, kreg::kernels::TryOpenImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::S64>>()
                                  .Attr<std::string_view>("path"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(Nap, kreg::kernels::NapImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::S64>>()
                                  .Attr<int64_t>("ms"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(Gate, kreg::kernels::GateImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::S64>>()
                                  .Attr<std::string_view>("path"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TryPtrace, kreg::kernels::TryPtraceImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::S64>>()
                                  .Attr<int64_t>("pid"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(FloodBrokers, kreg::kernels::FloodBrokersImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::S64>>()
                                  .Attr<int64_t>("announce")
                                  .Attr<int64_t>("send"));
