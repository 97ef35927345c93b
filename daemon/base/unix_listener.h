// A listening Unix stream socket that kregd binds at a path (DESIGN §12:
// sockets survive restarts). The socket is bound at a temporary name next
// to `path` with its final mode and group, listens, and is then renamed
// over `path`: a new kregd takes the path over from a dead one atomically,
// so there is no moment at which the path is missing (a client that
// connects meanwhile reaches the old socket, refused, or the new one).
#ifndef KREGD_DAEMON_BASE_UNIX_LISTENER_H_
#define KREGD_DAEMON_BASE_UNIX_LISTENER_H_

#include <sys/types.h>

#include <chrono>
#include <string>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace kreg {

class UnixListener {
 public:
  // Binds and listens at `path` with `mode` (e.g. 0660) and, unless gid is
  // -1, group `gid`. FAILED_PRECONDITION when `path` exists and is not a
  // socket, ALREADY_EXISTS when a live daemon answers there,
  // INVALID_ARGUMENT for a path too long for a socket address (messages
  // name the socket as `what`, e.g. "session socket"), else the failing
  // call's errno.
  static absl::StatusOr<UnixListener> Bind(const std::string& path, mode_t mode,
                                           gid_t gid, const std::string& what);

  UnixListener(UnixListener&&) = default;
  UnixListener& operator=(UnixListener&&) = default;
  // Removes `path` if it is still this socket (a newer kregd may have
  // taken it over meanwhile: then it is left alone).
  ~UnixListener();

  int fd() const { return fd_.get(); }

 private:
  UnixListener(UniqueFd fd, std::string path, ino_t ino, dev_t dev);

  UniqueFd fd_;
  std::string path_;
  ino_t ino_ = 0;
  dev_t dev_ = 0;
};

// What an accept loop does after accept4 on the socket named `what` (e.g.
// "session socket") failed with `err`. Out of descriptors or memory
// (EMFILE, ENFILE, ENOBUFS, ENOMEM) leaves the connection queued and the
// socket readable, so polling it again at once would spin: returns the
// pause (100 ms) before the loop polls it again, logged at most once per
// 10 s per socket with what to do. Anything else returns 0; the peer's
// (ECONNABORTED) and transient failures (EINTR, EAGAIN) are not logged.
std::chrono::milliseconds AcceptFailed(const std::string& what, int err);

}  // namespace kreg

#endif  // KREGD_DAEMON_BASE_UNIX_LISTENER_H_
