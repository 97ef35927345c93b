// The compile service's edge (DESIGN §13, §6): a CompileTarget request's
// client bytes checked once, before any resource is spent on them, and the
// cache key computed from the checked request.
#ifndef KREGD_DAEMON_COMPILE_SERVICE_COMPILE_REQUEST_H_
#define KREGD_DAEMON_COMPILE_SERVICE_COMPILE_REQUEST_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/base/types.h"
#include "kreg/v1/registry.pb.h"

namespace kreg {

// Bounds on what a caller may send (docs/operator-guide.md, "The compile
// service"): files (sources and headers together), all their bytes, the
// options and the length of one name or option.
inline constexpr size_t kMaxCompileFiles = 256;
inline constexpr size_t kMaxCompileInputBytes = 7u << 20;  // < gRPC's 8 MiB
inline constexpr size_t kMaxCompileOptions = 64;
inline constexpr size_t kMaxCompileOptionBytes = 4096;
inline constexpr size_t kMaxCompileFileNameBytes = 255;

// A checked request: typed platform, validated names, sorted files.
struct CompileRequest {
  std::string target_name;
  std::string func_name;
  Platform platform = Platform::kCpu;
  std::vector<std::pair<std::string, std::string>> sources;  // name, text
  std::vector<std::pair<std::string, std::string>> headers;
  std::vector<std::string> options;
  std::string content_id;  // the caller's, or empty
  bool replace = false;
  uint64_t bytes = 0;  // the files' names and texts (the queue counts them)
};

// Checks every field (target and function names, platform, content_id,
// file names: sources plain names with a known extension, headers relative
// paths without "." or ".." parts; no duplicates; counts and sizes within
// the bounds above; options without NUL). INVALID_ARGUMENT quoting the
// offending value and saying what to send instead.
absl::StatusOr<CompileRequest> ParseCompileRequest(
    const v1::CompileTargetRequest& req);

// "kcc-sha256:<64 hex>": sha256 over the platform, the compiler's identity
// (`compiler_identity`: its path, `--version` and target arch), the sorted
// sources and headers (names and bytes) and the options in order, each
// length-prefixed so that no two requests share an encoding.
std::string CompileCacheKey(const CompileRequest& req,
                            const std::string& compiler_identity);

// Where a build of `key` for a caller of `uid` is kept and looked up (the
// compile cache, single flight, the cluster's records): a compile runs as
// its caller, who could tamper with it, so a build is only reused for the
// same uid. The key itself (the content_id) is the same for everybody.
std::string CallerScopedKey(const std::string& key, uint32_t uid);
// The 64 hex digits of a key made by CompileCacheKey or CallerScopedKey
// (cache file names).
std::string KeyHex(const std::string& key);

}  // namespace kreg

#endif  // KREGD_DAEMON_COMPILE_SERVICE_COMPILE_REQUEST_H_
