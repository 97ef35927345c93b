// Module uploads over the session socket's control connections as a file
// descriptor (a sealed memfd) instead of message bytes, so a module of any
// size up to max_module_bytes registers there like through the gRPC
// stream, and kregd reads exactly the bytes that were checked.
#ifndef KREGD_DAEMON_BASE_MODULE_UPLOAD_H_
#define KREGD_DAEMON_BASE_MODULE_UPLOAD_H_

#include <fcntl.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "common/wire.h"
#include "daemon/base/uid_account.h"

namespace kreg {

// The seals an uploaded module's memfd must carry: its bytes and size are
// fixed for good once kregd has checked them.
constexpr int kModuleSeals = F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW;

// Reads the first `size` bytes of `fd` (from offset 0, with pread, so the
// sender's file offset does not matter). INVALID_ARGUMENT when `size` is 0
// or exceeds `max_module_bytes` (checked before reading, with both numbers
// in the message) or when the fd holds fewer than `size` bytes.
absl::StatusOr<std::string> ReadModuleFd(int fd, uint64_t size,
                                         uint64_t max_module_bytes);

// kregd's side of an upload: the bytes of `fd`, which must be a memfd
// sealed with (at least) kModuleSeals whose size (fstat) is exactly `size`,
// with 0 < size <= max_module_bytes, and not sparse (storage for all its
// bytes: a hole costs the sender nothing and kregd a copy and a hash).
// INVALID_ARGUMENT naming what is wrong otherwise, before a byte is read.
absl::StatusOr<std::string> ReadSealedModule(int fd, uint64_t size,
                                             uint64_t max_module_bytes);

// Charges an upload's announced `size` bytes (a sealed memfd's st_size,
// sparse or not; a gRPC stream's module.upload_size) to `uid`'s share of
// upload bytes in flight (UidResource::kUploadBytes,
// max_upload_bytes_per_uid) before a byte of it is read, for both paths
// alike; RESOURCE_EXHAUSTED naming the limit when that would exceed it
// (other uids keep their share). Null `account`: unbounded.
absl::StatusOr<UidAccount::Charge> HoldUpload(UidAccount* account, uid_t uid,
                                              uint64_t size);

}  // namespace kreg

#endif  // KREGD_DAEMON_BASE_MODULE_UPLOAD_H_
