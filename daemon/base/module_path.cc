#include "daemon/base/module_path.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/openat2.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "common/wire.h"
#include "daemon/base/files.h"
#include "daemon/base/types.h"

extern char** environ;

namespace kreg {
namespace {

constexpr int kReplyFd = 3;
constexpr int kHelperTimeoutMs = 10000;

bool UnderRoot(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  return path == root || absl::StartsWith(path, root + "/");
}

// openat2(RESOLVE_BENEATH) of `real` relative to the open `dir` (`root`);
// open(O_NOFOLLOW) where openat2 does not exist.
int OpenBeneath(int dir, const std::string& root, const std::string& real,
                int flags) {
  std::string rel = root == "/"
                        ? real.substr(1)
                        : real.substr(std::min(real.size(), root.size() + 1));
  if (rel.empty()) rel = ".";
  open_how how{};
  how.flags = flags | O_CLOEXEC | O_NOFOLLOW;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  long fd = ::syscall(SYS_openat2, dir, rel.c_str(), &how, sizeof(how));
  if (fd >= 0 || errno != ENOSYS) return static_cast<int>(fd);
  return ::open(real.c_str(), flags | O_CLOEXEC | O_NOFOLLOW);
}

// Takes uid's groups, then gid, then uid (all three ids). 0 or an errno.
int TakeCredentials(uid_t uid, gid_t gid) {
  const std::vector<gid_t> groups = GroupsOf(uid, gid);
  if (::setgroups(groups.size(), groups.data()) != 0) return errno;
  if (::setresgid(gid, gid, gid) != 0) return errno;
  if (::setresuid(uid, uid, uid) != 0) return errno;
  // Not traceable by the caller: the descriptor goes back to root.
  ::prctl(PR_SET_DUMPABLE, 0);
  if (::geteuid() != uid || ::getegid() != gid) return EPERM;
  return 0;
}

}  // namespace

const char* FileTypeName(mode_t mode) {
  switch (mode & S_IFMT) {
    case S_IFREG:
      return "a regular file";
    case S_IFDIR:
      return "a directory";
    case S_IFIFO:
      return "a FIFO (named pipe)";
    case S_IFSOCK:
      return "a socket";
    case S_IFCHR:
      return "a character device";
    case S_IFBLK:
      return "a block device";
    case S_IFLNK:
      return "a symbolic link";
    default:
      return "a special file";
  }
}

PathOpen OpenModulePath(const std::string& path,
                        const std::vector<std::string>& roots) {
  PathOpen r;
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) == nullptr) {
    r.err = errno;
    return r;
  }
  r.real = resolved;
  r.stage = PathOpen::kOutsideRoots;
  for (const std::string& root : roots) {
    if (r.root.empty() && UnderRoot(r.real, root)) r.root = root;
  }
  if (r.root.empty()) return r;
  r.stage = PathOpen::kOpenFailed;
  UniqueFd dir(::open(r.root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!dir.ok()) {
    r.err = errno;
    return r;
  }
  // O_PATH first: nothing is opened for reading (a FIFO would block, a
  // device could act) until fstat says it is a regular file.
  UniqueFd where(OpenBeneath(dir.get(), r.root, r.real, O_PATH));
  struct stat st;
  if (!where.ok() || ::fstat(where.get(), &st) != 0) {
    r.err = errno;
    return r;
  }
  if (S_ISLNK(st.st_mode)) {
    // A symlink swapped in after realpath: as O_NOFOLLOW would say.
    r.err = ELOOP;
    return r;
  }
  if (!S_ISREG(st.st_mode)) {
    r.stage = PathOpen::kNotRegular;
    r.mode = st.st_mode;
    return r;
  }
  // Re-open the very inode for reading (checks read permission).
  std::string self = absl::StrCat("/proc/self/fd/", where.get());
  const int kRead = O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC;
  UniqueFd fd(::open(self.c_str(), kRead));
  if (!fd.ok() && errno == ENOENT) {
    fd.reset(OpenBeneath(dir.get(), r.root, r.real, kRead & ~O_CLOEXEC));
  }
  struct stat again;
  if (!fd.ok() || ::fstat(fd.get(), &again) != 0) {
    r.err = errno;
    return r;
  }
  if (again.st_dev != st.st_dev || again.st_ino != st.st_ino ||
      !S_ISREG(again.st_mode)) {
    r.err = ELOOP;  // replaced between the two opens (fallback path only)
    return r;
  }
  r.stage = PathOpen::kOpened;
  r.fd = std::move(fd);
  return r;
}

std::string EncodePathOpen(const PathOpen& r) {
  std::string out = absl::StrCat(static_cast<int>(r.stage), " ", r.err, " ",
                                 static_cast<unsigned>(r.mode));
  out.push_back('\0');
  out += r.root;
  out.push_back('\0');
  out += r.real;
  return out;
}

absl::StatusOr<PathOpen> DecodePathOpen(const std::string& payload) {
  std::vector<std::string> parts = absl::StrSplit(payload, '\0');
  PathOpen r;
  int stage = -1;
  unsigned mode = 0;
  std::vector<absl::string_view> head;
  if (parts.size() == 3) head = absl::StrSplit(parts[0], ' ');
  if (head.size() != 3 || !absl::SimpleAtoi(head[0], &stage) ||
      !absl::SimpleAtoi(head[1], &r.err) || !absl::SimpleAtoi(head[2], &mode) ||
      stage < PathOpen::kUnresolved || stage > PathOpen::kOpened) {
    return absl::InternalError(absl::StrCat(
        "the open helper's reply is unreadable (", payload.size(), " bytes)"));
  }
  r.stage = static_cast<PathOpen::Stage>(stage);
  r.mode = static_cast<mode_t>(mode);
  r.root = parts[1];
  r.real = parts[2];
  return r;
}

int ServeOpenAs(int argc, char** argv) {
  // argv: kregd-probe --open-as UID GID PATH ROOT...
  uint32_t uid = 0, gid = 0;
  if (argc < 5 || !absl::SimpleAtoi(argv[2], &uid) ||
      !absl::SimpleAtoi(argv[3], &gid)) {
    std::fprintf(stderr, "usage: kregd-probe --open-as UID GID PATH ROOT...\n");
    return 2;
  }
  PathOpen r;
  r.stage = PathOpen::kCredentials;
  r.err = TakeCredentials(uid, gid);
  if (r.err == 0) {
    r = OpenModulePath(argv[4],
                       std::vector<std::string>(argv + 5, argv + argc));
  }
  std::string reply = EncodePathOpen(r);
  int fd = r.fd.get();
  int rc = wire::SendFrame(kReplyFd, reply.data(), reply.size(), &fd,
                           r.fd.ok() ? 1 : 0);
  return rc == wire::kOk ? 0 : 1;
}

absl::StatusOr<PathOpen> OpenModulePathAs(const std::string& helper,
                                          const std::string& path,
                                          const std::vector<std::string>& roots,
                                          uid_t uid, gid_t gid) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return ErrnoError("socketpair for the open helper");
  }
  UniqueFd mine(sv[0]), theirs(sv[1]);
  if (theirs.get() <= kReplyFd) {
    // dup2 onto itself would keep O_CLOEXEC: move it out of the way first.
    theirs.reset(::fcntl(theirs.get(), F_DUPFD_CLOEXEC, kReplyFd + 1));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, theirs.get(), kReplyFd);
#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 34)
  // Nothing else of the daemon's reaches a process with the caller's uid.
  posix_spawn_file_actions_addclosefrom_np(&actions, kReplyFd + 1);
#endif
  std::vector<std::string> args = {helper, "--open-as", std::to_string(uid),
                                   std::to_string(gid), path};
  args.insert(args.end(), roots.begin(), roots.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, helper.c_str(), &actions, nullptr, argv.data(),
                         environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("cannot start the open helper ",
                                            helper, ": ", strerror(rc)));
  }
  theirs.reset();
  pollfd p{mine.get(), POLLIN, 0};
  int ready;
  do {
    ready = ::poll(&p, 1, kHelperTimeoutMs);
  } while (ready < 0 && errno == EINTR);
  std::string payload;
  std::vector<int> fds;
  int got = ready > 0 ? wire::RecvFrame(mine.get(), 1 << 16, &payload, &fds)
                      : wire::kTruncated;
  if (ready == 0) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::vector<UniqueFd> owned;
  for (int fd : fds) owned.emplace_back(fd);
  if (ready == 0) {
    return absl::DeadlineExceededError(absl::StrCat(
        "opening \"", path, "\" as uid ", uid, " did not finish within ",
        kHelperTimeoutMs / 1000,
        " s (a hung network or FUSE file system?); upload the bytes instead"));
  }
  if (got != wire::kOk) {
    return absl::InternalError(
        absl::StrCat("the open helper ", helper, " gave no answer (",
                     wire::ResultText(got), "; exit status ", status, ")"));
  }
  KREG_ASSIGN_OR_RETURN(PathOpen r, DecodePathOpen(payload));
  if ((r.stage == PathOpen::kOpened) != (owned.size() == 1)) {
    return absl::InternalError(
        absl::StrCat("the open helper sent ", owned.size(),
                     " descriptors for stage ", static_cast<int>(r.stage)));
  }
  if (!owned.empty()) r.fd = std::move(owned[0]);
  return r;
}

}  // namespace kreg
