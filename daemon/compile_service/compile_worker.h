// Runs one compile job in a kregd-compile process (DESIGN §13): kregd
// itself never runs a compiler. The worker runs as the caller, so its
// answer is untrusted bytes: DecodeWorkerResult checks them.
#ifndef KREGD_DAEMON_COMPILE_SERVICE_COMPILE_WORKER_H_
#define KREGD_DAEMON_COMPILE_SERVICE_COMPILE_WORKER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "kreg/v1/compile.pb.h"

namespace kreg {

// The largest diagnostics a worker may return (1 MiB and a truncation
// note).
inline constexpr size_t kMaxWorkerDiagnosticsBytes = (1u << 20) + 256;

// Parses a worker's answer: at most max_module_bytes + diagnostics + 64 KiB
// of protobuf; the module at most `max_module_bytes`, the diagnostics at
// most kMaxWorkerDiagnosticsBytes, the code a canonical status code,
// `limit` one of the compile limit keys, and a module present exactly when
// the code is 0. INTERNAL saying what was wrong otherwise.
absl::StatusOr<v1::CompileJobResult> DecodeWorkerResult(
    const std::string& bytes, uint64_t max_module_bytes);

// Starts `binary` with posix_spawn (stdin and stdout one socket to kregd,
// stderr kregd's), sends `job`, and waits up to `timeout` for its answer
// (then kills it). `cancelled` (optional) is asked about once a second: when
// it says true the worker is killed. UNAVAILABLE when it cannot start or
// dies without answering, DEADLINE_EXCEEDED past the timeout, CANCELLED,
// DecodeWorkerResult's errors.
absl::StatusOr<v1::CompileJobResult> RunCompileWorker(
    const std::string& binary, const v1::CompileJob& job,
    std::chrono::milliseconds timeout, uint64_t max_module_bytes,
    const std::function<bool()>& cancelled = nullptr);

}  // namespace kreg

#endif  // KREGD_DAEMON_COMPILE_SERVICE_COMPILE_WORKER_H_
