#include "daemon/base/validate.h"

#include <grp.h>
#include <pwd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/handler_spec.h"
#include "common/platforms.h"
#include "common/status_macros.h"

namespace kreg {
namespace {

constexpr size_t kMaxNameLength = 256;
constexpr size_t kMaxPathBytes = 4096;  // PATH_MAX, with its NUL

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
  const std::string_view spelling(platform.data(), platform.size());
  if (int i = FindPlatform(spelling); i >= 0) return static_cast<Platform>(i);
  if (IsUnservedPlatform(spelling)) {
    return absl::UnimplementedError(
        absl::StrCat("platform ", QuoteForMessage(platform),
                     " is not supported by kregd; use ", PlatformChoices()));
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown platform ",
                                                 QuoteForMessage(platform),
                                                 "; use ", PlatformChoices()));
}

absl::Status ValidateFuncName(absl::string_view func_name) {
  return CanonicalFuncName(func_name).status();
}

absl::StatusOr<std::string> CanonicalFuncName(absl::string_view func_name) {
  HandlerSpec spec;
  std::string error;
  if (!ParseHandlerSpec(std::string(func_name), &spec, &error)) {
    return absl::InvalidArgumentError(error);
  }
  return spec.Format();
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

absl::Status ValidateClientContentId(absl::string_view content_id) {
  KREG_RETURN_IF_ERROR(ValidateContentId(content_id));
  if (absl::StartsWithIgnoreCase(content_id, "kcc-")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "content_id ", QuoteForMessage(content_id),
        " starts with \"kcc-\", which is reserved for modules kregd compiled "
        "itself (kreg.compile_ffi_target, kregctl compile); use another "
        "content_id, or have kregd compile the sources"));
  }
  return absl::OkStatus();
}

bool IsValidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = s[i];
    int extra;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      extra = 1;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      extra = 2;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      extra = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (s.size() - i <= static_cast<size_t>(extra)) return false;
    for (int k = 1; k <= extra; ++k) {
      unsigned char cc = s[i + k];
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    i += extra + 1;
  }
  return true;
}

absl::Status ValidateModulePath(absl::string_view path) {
  if (path.empty()) {
    return absl::InvalidArgumentError(
        "module path is empty; give the absolute path of the .so on the "
        "daemon's host, or upload its bytes");
  }
  size_t nul = path.find('\0');
  if (nul != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "module path ", QuoteForMessage(path), " contains a NUL byte at ",
        "position ", nul, "; a path cannot contain NUL (refused, not cut)"));
  }
  if (path[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "module path ", QuoteForMessage(path),
        " is not absolute; the daemon resolves paths on its own host"));
  }
  if (path.size() >= kMaxPathBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("module path ", QuoteForMessage(path), " is ", path.size(),
                     " bytes long; the limit is ", kMaxPathBytes - 1));
  }
  if (!IsValidUtf8(path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "module path ", QuoteForMessage(path),
        " is not valid UTF-8; rename the file or upload its bytes"));
  }
  return absl::OkStatus();
}

absl::Status ValidateModuleFileName(absl::string_view name) {
  if (name.size() > kMaxNameLength || name.find('\0') != name.npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "module file name ", QuoteForMessage(name),
        " must be at most 256 bytes without NUL (it is shown in messages)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateUploadChunk(size_t size, size_t index) {
  if (size <= kMaxUploadChunkBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "upload chunk ", index, " carries ", size,
      " bytes; a chunk may carry at ", "most ", kMaxUploadChunkBytes,
      " (4 MiB, kreg.v1.RegisterTargetChunk): ",
      "send the module in smaller chunks"));
}

absl::StatusOr<NameReservation> ParseReservation(absl::string_view pattern,
                                                 absl::string_view owner) {
  NameReservation r;
  r.pattern = std::string(pattern);
  absl::string_view prefix = pattern;
  if (absl::ConsumeSuffix(&prefix, "*") && prefix.empty()) {
    return absl::InvalidArgumentError(
        "a reservation pattern of \"*\" alone would reserve every name; "
        "give a name prefix before the '*', e.g. \"mylib.*\"");
  }
  absl::Status name = ValidateTargetName(prefix);
  if (!name.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("reservation pattern ", QuoteForMessage(pattern),
                     " is not a target name or a name prefix followed by '*': ",
                     name.message()));
  }
  absl::string_view who = owner;
  r.group = absl::ConsumePrefix(&who, "group:");
  char buf[4096];
  if (absl::SimpleAtoi(who, &r.owner)) return r;
  const std::string key(who);
  if (r.group) {
    struct group gr;
    struct group* found = nullptr;
    if (!who.empty() &&
        ::getgrnam_r(key.c_str(), &gr, buf, sizeof(buf), &found) == 0 &&
        found != nullptr) {
      r.owner = found->gr_gid;
      return r;
    }
  } else {
    struct passwd pw;
    struct passwd* found = nullptr;
    if (!who.empty() &&
        ::getpwnam_r(key.c_str(), &pw, buf, sizeof(buf), &found) == 0 &&
        found != nullptr) {
      r.owner = found->pw_uid;
      return r;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "reservation owner ", QuoteForMessage(owner), " is no ",
      r.group ? "group" : "user",
      " on this host; give a user name or uid, or \"group:\" and a group name "
      "or gid"));
}

}  // namespace kreg
