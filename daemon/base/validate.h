// Edge validation shared by the gRPC service and the session server: every
// check that turns untrusted strings into typed values lives here, once.
#ifndef KREGD_DAEMON_BASE_VALIDATE_H_
#define KREGD_DAEMON_BASE_VALIDATE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/base/types.h"

namespace kreg {

// Quotes untrusted text for an error message: control and non-ASCII bytes
// escaped as \xNN, at most 80 characters (then "...").
std::string QuoteForMessage(absl::string_view s);

// 1-256 chars of [A-Za-z0-9_.:-], first a letter or '_'. INVALID_ARGUMENT
// quoting the name otherwise.
absl::Status ValidateTargetName(absl::string_view name);

// "cpu"/"host" -> kCpu, "cuda"/"gpu" -> kCuda, case-insensitive.
// UNIMPLEMENTED for known-but-unsupported platforms (rocm, tpu, ...),
// INVALID_ARGUMENT for anything else.
absl::StatusOr<Platform> ParsePlatform(absl::string_view platform);

// A name reservation's pattern and owner: `pattern` is a target name, or a
// non-empty name prefix followed by '*'; `owner` a user name or uid, or
// "group:" and a group name or gid, known on this host. INVALID_ARGUMENT
// quoting the offending value otherwise.
absl::StatusOr<NameReservation> ParseReservation(absl::string_view pattern,
                                                 absl::string_view owner);

// A target's function: a C symbol name (1-256 chars of [A-Za-z0-9_], not
// starting with a digit), or a handler bundle (common/handler_spec.h,
// "execute=Foo;instantiate=Bar"). INVALID_ARGUMENT naming the stage and
// the symbol otherwise.
absl::Status ValidateFuncName(absl::string_view func_name);
// The canonical spelling of a valid function (HandlerSpec::Format), so one
// bundle is stored, compared and listed one way.
absl::StatusOr<std::string> CanonicalFuncName(absl::string_view func_name);

// Optional caller identity: empty, or 1-256 printable ASCII chars without
// whitespace.
absl::Status ValidateContentId(absl::string_view content_id);

// A content_id from a client: ValidateContentId, and not starting with
// "kcc-" (any case), which the compile service's cache keys
// ("kcc-sha256:...") use: only its own registrations may (INVALID_ARGUMENT
// saying so).
absl::Status ValidateClientContentId(absl::string_view content_id);

// Whether `s` is well-formed UTF-8 (no overlong forms, surrogates or code
// points above U+10FFFF).
bool IsValidUtf8(absl::string_view s);

// A daemon-side module path: non-empty, absolute, no NUL byte (refused, not
// cut at it), shorter than PATH_MAX, valid UTF-8. INVALID_ARGUMENT quoting
// the path (and the NUL's position) otherwise.
absl::Status ValidateModulePath(absl::string_view path);

// The client's name for an uploaded module, used in messages only: at most
// 256 bytes without NUL (may be empty). INVALID_ARGUMENT otherwise.
absl::Status ValidateModuleFileName(absl::string_view name);

// Largest RegisterTargetChunk.module_bytes (registry.proto: 4 MiB).
constexpr size_t kMaxUploadChunkBytes = 4u << 20;

// INVALID_ARGUMENT quoting the size when upload chunk number `index` (from
// 1) carries more than kMaxUploadChunkBytes.
absl::Status ValidateUploadChunk(size_t size, size_t index);

}  // namespace kreg

#endif  // KREGD_DAEMON_BASE_VALIDATE_H_
