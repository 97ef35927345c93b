// Fuzzes what the compile service takes in (DESIGN §6, §13): a
// CompileTargetRequest from any local user (ParseCompileRequest and the
// cache key, compile_request.h) and the answer of a kregd-compile worker,
// which runs as the caller (DecodeWorkerResult, compile_worker.h).
//
// Input: byte 0 % 2 picks the decoder, the rest is its input.
// 0: CompileTargetRequest bytes. Accepted requests: 1-256 files, source
//    names plain (no '/', not "." or "..", not starting with '-'), header
//    names relative without "." or ".." parts, no name twice, all bytes
//    within kMaxCompileInputBytes, options without NUL, sources and headers
//    sorted; the cache key is "kcc-sha256:" and 64 hex digits, the same for
//    the same request and different for another compiler identity.
// 1: CompileJobResult bytes with max_module_bytes 4096. Accepted answers:
//    a module within the bound, a code 0-16, a module or identity exactly
//    when the code is 0, a known limit key.
#include <cstdint>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "daemon/compile_service/compile_request.h"
#include "daemon/compile_service/compile_worker.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using namespace kreg;

bool PlainPart(absl::string_view p) {
  return !p.empty() && p != "." && p != ".." && p[0] != '-' &&
         p.find('/') == absl::string_view::npos;
}

void Request(const std::string& in) {
  v1::CompileTargetRequest req;
  if (!req.ParseFromString(in)) return;
  absl::StatusOr<CompileRequest> r = ParseCompileRequest(req);
  if (!r.ok()) {
    if (r.status().message().empty()) fuzz::Fail("refusal without a message");
    return;
  }
  const size_t files = r->sources.size() + r->headers.size();
  if (r->sources.empty() || files > kMaxCompileFiles) fuzz::Fail("file count");
  std::set<std::string> names;
  size_t bytes = 0;
  for (const auto& [name, text] : r->sources) {
    if (!PlainPart(name)) fuzz::Fail("source name " + name);
    names.insert(name);
    bytes += name.size() + text.size();
  }
  for (const auto& [name, text] : r->headers) {
    if (absl::StartsWith(name, "/")) fuzz::Fail("absolute header " + name);
    for (absl::string_view part : absl::StrSplit(name, '/')) {
      if (!PlainPart(part)) fuzz::Fail("header name " + name);
    }
    names.insert(name);
    bytes += name.size() + text.size();
  }
  if (names.size() != files) fuzz::Fail("a name twice");
  if (bytes > kMaxCompileInputBytes) fuzz::Fail("input bytes over the limit");
  for (const std::string& o : r->options) {
    if (o.empty() || o.find('\0') != std::string::npos) fuzz::Fail("option");
  }
  if (!std::is_sorted(r->sources.begin(), r->sources.end()) ||
      !std::is_sorted(r->headers.begin(), r->headers.end())) {
    fuzz::Fail("files not sorted");
  }
  const std::string key = CompileCacheKey(*r, "g++ 12");
  if (!absl::StartsWith(key, "kcc-sha256:") || key.size() != 11 + 64 ||
      KeyHex(key).size() != 64) {
    fuzz::Fail("key format " + key);
  }
  if (CompileCacheKey(*r, "g++ 12") != key) fuzz::Fail("key not stable");
  if (CompileCacheKey(*r, "g++ 13") == key) fuzz::Fail("identity ignored");
}

void Answer(const std::string& in) {
  constexpr uint64_t kMax = 4096;
  absl::StatusOr<v1::CompileJobResult> r = DecodeWorkerResult(in, kMax);
  if (!r.ok()) {
    if (r.status().message().empty()) fuzz::Fail("refusal without a message");
    return;
  }
  if (r->module().size() > kMax) fuzz::Fail("module over the bound");
  if (r->code() < 0 || r->code() > 16) fuzz::Fail("code out of range");
  if ((r->code() == 0) != (!r->module().empty() || !r->identity().empty())) {
    fuzz::Fail("module without success, or success without a module");
  }
  if (r->diagnostics().size() > kMaxWorkerDiagnosticsBytes) {
    fuzz::Fail("diagnostics over the bound");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static bool quiet = (fuzz::QuietLogs(), true);
  (void)quiet;
  if (size == 0) return 0;
  const std::string in(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    Request(in);
  } else {
    Answer(in);
  }
  return 0;
}
