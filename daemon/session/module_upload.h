// Module uploads over a session as a file descriptor (a memfd) instead of
// message bytes, so a module of any size up to max_module_bytes registers
// through the session like through the gRPC stream (issue 11, item 5).
#ifndef KREGD_DAEMON_SESSION_MODULE_UPLOAD_H_
#define KREGD_DAEMON_SESSION_MODULE_UPLOAD_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kreg {

// Reads the first `size` bytes of `fd` (from offset 0, with pread, so the
// sender's file offset does not matter). INVALID_ARGUMENT when `size` is 0
// or exceeds `max_module_bytes` (checked before reading, with both numbers
// in the message) or when the fd holds fewer than `size` bytes.
absl::StatusOr<std::string> ReadModuleFd(int fd, uint64_t size,
                                         uint64_t max_module_bytes);

}  // namespace kreg

#endif  // KREGD_DAEMON_SESSION_MODULE_UPLOAD_H_
