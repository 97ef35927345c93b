#include "daemon/compile_service/compile_request.h"

#include <algorithm>
#include <cstdint>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "daemon/base/platform_table.h"
#include "daemon/base/sha256.h"
#include "daemon/base/validate.h"

namespace kreg {
namespace {

constexpr char kKeyPrefix[] = "kcc-sha256:";

// One path component: printable ASCII other than '/' and '\\', not "."
// or "..", not starting with '-' (the compiler would read an option).
bool GoodComponent(absl::string_view part) {
  if (part.empty() || part == "." || part == ".." || part[0] == '-') {
    return false;
  }
  for (char c : part) {
    if (c <= 0x20 || c >= 0x7f || c == '/' || c == '\\') return false;
  }
  return true;
}

bool KnownExtension(absl::string_view name, Platform platform) {
  for (absl::string_view ext : {".cc", ".cpp", ".cxx", ".c", ".C"}) {
    if (absl::EndsWith(name, ext)) return true;
  }
  return TraitsOf(platform).compiler == PlatformCompiler::kNvcc &&
         absl::EndsWith(name, ".cu");
}

absl::Status BadFile(absl::string_view kind, absl::string_view name,
                     absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "compile: ", kind, " name ", QuoteForMessage(name), " ", why));
}

absl::Status CheckName(absl::string_view kind, absl::string_view name,
                       bool paths) {
  if (name.size() > kMaxCompileFileNameBytes) {
    return BadFile(
        kind, name,
        absl::StrCat("is longer than ", kMaxCompileFileNameBytes, " bytes"));
  }
  if (!paths) {
    if (!GoodComponent(name)) {
      return BadFile(kind, name,
                     "must be a plain file name: printable ASCII without "
                     "spaces, '/' or '\\', not \".\" or \"..\", not starting "
                     "with '-'");
    }
    return absl::OkStatus();
  }
  if (name.empty() || name[0] == '/') {
    return BadFile(kind, name,
                   "must be a relative path (\"x.h\" or \"dir/x.h\"); pass an "
                   "include directory's files by their path inside it");
  }
  for (absl::string_view part : absl::StrSplit(name, '/')) {
    if (!GoodComponent(part)) {
      return BadFile(kind, name,
                     "has an empty, \".\", \"..\" or otherwise bad path part "
                     "(printable ASCII without spaces or '\\', not starting "
                     "with '-')");
    }
  }
  return absl::OkStatus();
}

// Appends tag, length (8 bytes, little-endian) and bytes: the hashed form.
void PutField(std::string* h, char tag, absl::string_view s) {
  h->push_back(tag);
  for (int i = 0; i < 8; ++i)
    h->push_back(static_cast<char>(s.size() >> (8 * i)));
  h->append(s.data(), s.size());
}

}  // namespace

absl::StatusOr<CompileRequest> ParseCompileRequest(
    const v1::CompileTargetRequest& req) {
  CompileRequest out;
  KREG_RETURN_IF_ERROR(ValidateTargetName(req.target_name()));
  KREG_RETURN_IF_ERROR(ValidateFuncName(req.func_name()));
  KREG_ASSIGN_OR_RETURN(Platform platform, ParsePlatform(req.platform()));
  KREG_RETURN_IF_ERROR(ValidateClientContentId(req.content_id()));
  out.target_name = req.target_name();
  out.func_name = req.func_name();
  out.platform = platform;
  out.content_id = req.content_id();
  out.replace = req.replace();
  const size_t files = req.sources_size() + req.headers_size();
  if (req.sources_size() == 0) {
    return absl::InvalidArgumentError(
        "compile: no sources; send at least one translation unit (e.g. "
        "{\"kernel.cc\": text})");
  }
  if (files > kMaxCompileFiles) {
    return absl::InvalidArgumentError(
        absl::StrCat("compile: ", files,
                     " files (sources and headers) exceed the limit "
                     "of ",
                     kMaxCompileFiles, "; merge headers or compile a library"));
  }
  size_t bytes = 0;
  std::set<std::string> seen;
  for (int kind = 0; kind < 2; ++kind) {
    const bool header = kind == 1;
    const auto& list = header ? req.headers() : req.sources();
    for (const v1::SourceFile& f : list) {
      const char* what = header ? "header" : "source";
      KREG_RETURN_IF_ERROR(CheckName(what, f.name(), header));
      if (!header && !KnownExtension(f.name(), out.platform)) {
        return BadFile(
            what, f.name(),
            TraitsOf(out.platform).compiler == PlatformCompiler::kNvcc
                ? "needs a source extension (.cu, .cc, .cpp, "
                  ".cxx or .c); pass headers as headers"
                : "needs a C or C++ source extension (.cc, .cpp, "
                  ".cxx or .c); pass headers as headers");
      }
      if (!seen.insert(f.name()).second) {
        return BadFile(what, f.name(), "is sent twice; names must be unique");
      }
      bytes += f.name().size() + f.text().size();
      if (bytes > kMaxCompileInputBytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "compile: the sources and headers exceed the limit of ",
            kMaxCompileInputBytes, " bytes (at ", what, " ",
            QuoteForMessage(f.name()), ")"));
      }
      (header ? out.headers : out.sources).emplace_back(f.name(), f.text());
    }
  }
  // A file cannot also be a directory of another ("a.h" and "a.h/b.h").
  for (const std::string& name : seen) {
    for (size_t slash = name.find('/'); slash != std::string::npos;
         slash = name.find('/', slash + 1)) {
      if (seen.count(name.substr(0, slash)) != 0) {
        return BadFile("header", name,
                       absl::StrCat("lies under \"", name.substr(0, slash),
                                    "\", which is sent as a file"));
      }
    }
  }
  if (req.options_size() > static_cast<int>(kMaxCompileOptions)) {
    return absl::InvalidArgumentError(
        absl::StrCat("compile: ", req.options_size(),
                     " options exceed the limit of ", kMaxCompileOptions));
  }
  for (const std::string& o : req.options()) {
    if (o.empty() || o.size() > kMaxCompileOptionBytes ||
        o.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("compile: option ", QuoteForMessage(o), " must be 1-",
                       kMaxCompileOptionBytes, " bytes without NUL"));
    }
    out.options.push_back(o);
  }
  std::sort(out.sources.begin(), out.sources.end());
  std::sort(out.headers.begin(), out.headers.end());
  out.bytes = bytes;
  return out;
}

std::string CompileCacheKey(const CompileRequest& req,
                            const std::string& compiler_identity) {
  std::string h;
  PutField(&h, 'V', "kreg-compile-v1");
  PutField(&h, 'P', PlatformName(req.platform));
  PutField(&h, 'C', compiler_identity);
  for (const auto& [name, text] : req.sources) {
    PutField(&h, 'S', name);
    PutField(&h, 's', text);
  }
  for (const auto& [name, text] : req.headers) {
    PutField(&h, 'H', name);
    PutField(&h, 'h', text);
  }
  for (const std::string& o : req.options) PutField(&h, 'O', o);
  return "kcc-" + Sha256Digest(h);  // kKeyPrefix and the hex digest
}

std::string CallerScopedKey(const std::string& key, uint32_t uid) {
  std::string h;
  PutField(&h, 'K', key);
  PutField(&h, 'U', absl::StrCat(uid));
  return "kcc-" + Sha256Digest(h);  // kKeyPrefix and the hex digest
}

std::string KeyHex(const std::string& key) {
  return absl::StartsWith(key, kKeyPrefix) ? key.substr(sizeof(kKeyPrefix) - 1)
                                           : key;
}

}  // namespace kreg
