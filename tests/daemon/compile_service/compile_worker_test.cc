#include "daemon/compile_service/compile_worker.h"

#include <string>

#include "catch2/catch.hpp"

namespace kreg {
namespace {

std::string Encode(const v1::CompileJobResult& r) {
  return r.SerializeAsString();
}

std::string Refusal(const std::string& bytes, uint64_t max = 100) {
  absl::StatusOr<v1::CompileJobResult> r = DecodeWorkerResult(bytes, max);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInternal);
  return std::string(r.status().message());
}

TEST_CASE("A successful answer carries its module", "[compile]") {
  v1::CompileJobResult r;
  r.set_module("ELF");
  r.set_diagnostics("warning: x");
  absl::StatusOr<v1::CompileJobResult> d = DecodeWorkerResult(Encode(r), 100);
  REQUIRE(d.ok());
  CHECK(d->module() == "ELF");
  CHECK(d->diagnostics() == "warning: x");
}

TEST_CASE("A failed answer names a known limit", "[compile]") {
  v1::CompileJobResult r;
  r.set_code(8);
  r.set_limit("compile_cpu_s");
  CHECK(DecodeWorkerResult(Encode(r), 100).ok());
  r.set_limit("compile_anything");
  CHECK(Refusal(Encode(r)).find("unknown limit") != std::string::npos);
}

TEST_CASE("Hostile answers are refused", "[compile]") {
  CHECK(Refusal("").find("not a CompileJobResult") != std::string::npos);
  CHECK(Refusal("\xff\xff\xff").find("not a CompileJobResult") !=
        std::string::npos);
  v1::CompileJobResult big;
  big.set_module(std::string(101, 'x'));
  CHECK(Refusal(Encode(big)).find("over compile_output_bytes") !=
        std::string::npos);
  v1::CompileJobResult code;
  code.set_code(99);
  code.set_message("x");
  CHECK(Refusal(Encode(code)).find("status code 99") != std::string::npos);
  v1::CompileJobResult failed_with_module;
  failed_with_module.set_code(3);
  failed_with_module.set_module("ELF");
  CHECK(Refusal(Encode(failed_with_module)).find("a module with a failure") !=
        std::string::npos);
  v1::CompileJobResult nothing;
  nothing.set_diagnostics("x");
  CHECK(Refusal(Encode(nothing)).find("or neither") != std::string::npos);
  v1::CompileJobResult diag;
  diag.set_code(3);
  diag.set_diagnostics(std::string(kMaxWorkerDiagnosticsBytes + 1, 'd'));
  CHECK(Refusal(Encode(diag), 1 << 30).find("over their limits") !=
        std::string::npos);
  CHECK(Refusal(std::string(100 + kMaxWorkerDiagnosticsBytes + 65537, 'x'))
            .find("more than a module") != std::string::npos);
}

TEST_CASE("A worker binary that does not exist is UNAVAILABLE, naming it",
          "[compile]") {
  v1::CompileJob job;
  job.set_identity_only(true);
  absl::StatusOr<v1::CompileJobResult> r = RunCompileWorker(
      "/nonexistent/kregd-compile", job, std::chrono::seconds(5), 100);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(r.status().message()).find("/nonexistent/kregd-compile") !=
        std::string::npos);
}

TEST_CASE("A worker that answers nothing is UNAVAILABLE", "[compile]") {
  v1::CompileJob job;
  absl::StatusOr<v1::CompileJobResult> r =
      RunCompileWorker("/bin/true", job, std::chrono::seconds(5), 100);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(r.status().message()).find("without an answer") !=
        std::string::npos);
}

TEST_CASE("A worker answering without end is killed at the bound",
          "[compile]") {
  v1::CompileJob job;
  absl::StatusOr<v1::CompileJobResult> r =
      RunCompileWorker("/usr/bin/yes", job, std::chrono::seconds(30), 100);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInternal);
  CHECK(std::string(r.status().message()).find("it was killed") !=
        std::string::npos);
}

TEST_CASE("A cancelled compile kills its worker: CANCELLED", "[compile]") {
  v1::CompileJob job;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<v1::CompileJobResult> r =
      RunCompileWorker("/usr/bin/yes", job, std::chrono::seconds(30), 1 << 30,
                       [] { return true; });
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kCancelled);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
}

TEST_CASE("A worker answering garbage is refused", "[compile]") {
  v1::CompileJob job;
  job.set_compiler("x");  // echoed by cat: a result with a message only
  absl::StatusOr<v1::CompileJobResult> r =
      RunCompileWorker("/bin/cat", job, std::chrono::seconds(5), 100);
  REQUIRE_FALSE(r.ok());
  CHECK(std::string(r.status().message()).find("or neither") !=
        std::string::npos);
}

}  // namespace
}  // namespace kreg
