#include "daemon/validate.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace kreg {
namespace {

constexpr size_t kMaxNameLength = 256;

}  // namespace

std::string QuoteForMessage(absl::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < 80; ++i) {
    unsigned char c = s[i];
    if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\') {
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
    } else {
      out.push_back(c);
    }
  }
  if (s.size() > 80) absl::StrAppend(&out, "...");
  return out + "\"";
}

absl::Status ValidateTargetName(absl::string_view name) {
  if (name.empty()) {
    return absl::InvalidArgumentError(
        "target name is empty; use 1-256 characters of [A-Za-z0-9_.:-] "
        "starting with a letter or '_'");
  }
  if (name.size() > kMaxNameLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("target name ", QuoteForMessage(name), " is ", name.size(),
                     " characters long; the limit is ", kMaxNameLength));
  }
  if (!absl::ascii_isalpha(name[0]) && name[0] != '_') {
    return absl::InvalidArgumentError(
        absl::StrCat("target name ", QuoteForMessage(name),
                     " must start with a letter or '_'"));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    if (!absl::ascii_isalnum(c) && c != '_' && c != '.' && c != ':' &&
        c != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat("target name ", QuoteForMessage(name),
                       " has an invalid character at position ", i,
                       "; allowed are [A-Za-z0-9_.:-]"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Platform> ParsePlatform(absl::string_view platform) {
  std::string p = absl::AsciiStrToLower(platform);
  if (p == "cpu" || p == "host") return Platform::kCpu;
  if (p == "cuda" || p == "gpu") return Platform::kCuda;
  if (p == "rocm" || p == "tpu" || p == "metal" || p == "sycl") {
    return absl::UnimplementedError(
        absl::StrCat("platform ", QuoteForMessage(platform),
                     " is not supported by kregd; use \"cpu\" or \"cuda\""));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown platform ", QuoteForMessage(platform),
                   "; use \"cpu\" (alias \"host\") or \"cuda\" (alias "
                   "\"gpu\")"));
}

absl::Status ValidateFuncName(absl::string_view func_name) {
  bool ok = !func_name.empty() && func_name.size() <= kMaxNameLength &&
            !absl::ascii_isdigit(func_name[0]);
  for (char c : func_name) ok = ok && (absl::ascii_isalnum(c) || c == '_');
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("function name ", QuoteForMessage(func_name),
                     " is not a C symbol name (1-256 characters of "
                     "[A-Za-z0-9_], not starting with a digit)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateContentId(absl::string_view content_id) {
  bool ok = content_id.size() <= kMaxNameLength;
  for (char c : content_id) ok = ok && c > 0x20 && c < 0x7f;
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("content_id ", QuoteForMessage(content_id),
                     " must be at most 256 printable ASCII characters "
                     "without spaces (or empty to use the module's sha256)"));
  }
  return absl::OkStatus();
}

}  // namespace kreg
