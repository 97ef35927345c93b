// Whole-buffer reads and writes and atomic files, for kregd and its helpers.
// Errors name the file (`what`, or the path) and the errno text.
#ifndef KREGD_DAEMON_BASE_FILES_H_
#define KREGD_DAEMON_BASE_FILES_H_

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kreg {

// INTERNAL "<what>[ <path>]: <errno text>".
absl::Status ErrnoError(absl::string_view what, absl::string_view path = "");

// The directory of `path` ("." for a bare name).
std::string DirOf(const std::string& path);
// mkdir -p with `mode` for the directories it creates.
absl::Status MakeDirs(const std::string& dir, mode_t mode);

// Writes all of `bytes`, retrying EINTR and short writes.
absl::Status WriteAll(int fd, absl::string_view bytes, absl::string_view what);

// Appends `fd` to its end to `out`, retrying EINTR and short reads;
// RESOURCE_EXHAUSTED, before reading past it, beyond `limit` bytes.
absl::Status ReadAll(int fd, std::string* out, size_t limit,
                     absl::string_view what);

// The file at `path` (ReadAll's limit); NOT_FOUND when there is none.
absl::StatusOr<std::string> ReadFile(const std::string& path, size_t limit);

// Replaces `path` so that a crash leaves the old or the new file: the two
// steps below, in `path`'s directory.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view bytes, mode_t mode);
// Writes and fsyncs a new file "<dir>/.tmp-<name>-XXXXXX": its path.
absl::StatusOr<std::string> WriteTempFile(const std::string& dir,
                                          absl::string_view name,
                                          absl::string_view bytes, mode_t mode);
// Renames `temp` over `path` and fsyncs the directory (removes `temp` when
// the rename fails).
absl::Status CommitTempFile(const std::string& temp, const std::string& path);
absl::Status SyncDir(const std::string& dir);

}  // namespace kreg

#endif  // KREGD_DAEMON_BASE_FILES_H_
