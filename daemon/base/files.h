// Whole-buffer reads and writes and atomic file replacement: the one copy
// kregd, kregd-exec and kregd-compile use. Every error names the path (or
// what the descriptor is) and the errno text.
#ifndef KREGD_DAEMON_BASE_FILES_H_
#define KREGD_DAEMON_BASE_FILES_H_

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kreg {

// Writes all of `bytes` to `fd`, retrying EINTR and short writes. `what`
// names the file in the error.
absl::Status WriteAll(int fd, absl::string_view bytes, absl::string_view what);

// Reads `fd` to its end into `out` (appending), retrying EINTR and short
// reads. RESOURCE_EXHAUSTED, before reading past it, when the file holds
// more than `limit` bytes.
absl::Status ReadAll(int fd, std::string* out, size_t limit,
                     absl::string_view what);

// Replaces `path` with `bytes` so that a crash leaves the old or the new
// file, never a part: WriteTempFile in `path`'s directory, then
// CommitTempFile.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view bytes, mode_t mode);

// The halves of WriteFileAtomically, for a caller that checks the file in
// between. WriteTempFile writes `bytes` to a new file ".tmp-<name>-XXXXXX"
// in `dir` with mode `mode` and fsyncs it; its path (removed on failure).
absl::StatusOr<std::string> WriteTempFile(const std::string& dir,
                                          absl::string_view name,
                                          absl::string_view bytes, mode_t mode);
// Renames `temp` (in the directory of `path`) over `path` and fsyncs the
// directory; removes `temp` when the rename fails.
absl::Status CommitTempFile(const std::string& temp, const std::string& path);

// fsyncs directory `dir` (after a rename or unlink in it).
absl::Status SyncDir(const std::string& dir);

}  // namespace kreg

#endif  // KREGD_DAEMON_BASE_FILES_H_
