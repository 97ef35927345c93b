#include "daemon/registry/registrar.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "common/unique_fd.h"
#include "daemon/base/files.h"
#include "daemon/base/log_limit.h"
#include "daemon/base/module_path.h"
#include "daemon/base/validate.h"
#include "daemon/store/module_store.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

// Whether `peer` may search (X_OK) or read (R_OK) a file with `st`'s owner
// and mode, by its mode bits: owner, then any of `groups`, then others.
bool ModeAllows(const struct stat& st, const PeerCred& peer,
                const std::vector<gid_t>& groups, int want) {
  mode_t user = want == R_OK ? S_IRUSR : S_IXUSR;
  if (st.st_uid == peer.uid) return (st.st_mode & user) != 0;
  for (gid_t g : groups) {
    if (st.st_gid == g) return (st.st_mode & (user >> 3)) != 0;
  }
  return (st.st_mode & (user >> 6)) != 0;
}

// Without root kregd cannot take the caller's credentials: checks the mode
// bits of every directory from "/" down to `real` (search) and of the file
// (read) for the peer. ACLs and capabilities are not considered.
absl::Status CheckModeBitsAlongPath(const std::string& real,
                                    const PeerCred& peer) {
  std::vector<gid_t> groups = GroupsOf(peer.uid, peer.gid);
  std::string dir = "/";
  for (absl::string_view part : absl::StrSplit(real, '/', absl::SkipEmpty())) {
    struct stat st;
    if (::stat(dir.c_str(), &st) == 0 && !ModeAllows(st, peer, groups, X_OK)) {
      return absl::PermissionDeniedError(absl::StrCat(
          "permission denied reading module \"", real, "\" as uid ", peer.uid,
          ": directory ", dir,
          " is not searchable by it (mode bits); the daemon reads paths only "
          "on behalf of callers who could read them themselves"));
    }
    dir = absl::StrCat(dir == "/" ? "" : dir, "/", part);
  }
  struct stat st;
  if (::stat(real.c_str(), &st) == 0 && !ModeAllows(st, peer, groups, R_OK)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "permission denied reading module \"", real, "\" as uid ", peer.uid,
        ": the file is not readable by it; the daemon reads paths only on "
        "behalf of callers who could read them themselves"));
  }
  return absl::OkStatus();
}

// The message for a path that could not be opened.
absl::Status PathOpenError(const PathOpen& r, const std::string& path,
                           const ModulePolicy& policy, const PeerCred& peer,
                           bool as_caller) {
  std::string who =
      as_caller ? absl::StrCat(" as uid ", peer.uid) : std::string();
  std::string shown = QuoteForMessage(path);
  switch (r.stage) {
    case PathOpen::kUnresolved:
      if (r.err == EACCES) {
        return absl::PermissionDeniedError(absl::StrCat(
            "permission denied resolving module path ", shown, who,
            ": a directory on the way is not searchable by the caller"));
      }
      return absl::NotFoundError(absl::StrCat(
          "module path ", shown, " cannot be resolved on the daemon's host",
          who, ": ", std::strerror(r.err)));
    case PathOpen::kOutsideRoots: {
      std::string roots;
      for (const std::string& root : policy.allowed_roots) {
        absl::StrAppend(&roots, roots.empty() ? "" : ", ", root);
      }
      return absl::PermissionDeniedError(absl::StrCat(
          "module path ", shown, " resolves to \"", r.real,
          "\", which is outside the daemon's allowed roots [", roots,
          "]; upload the bytes instead or ask the operator to add a root "
          "(--allow-root)"));
    }
    case PathOpen::kOpenFailed:
      if (r.err == EXDEV || r.err == ELOOP) {
        // The tree changed between realpath and open (a directory or link
        // was swapped to point outside the root): refuse, as an escape.
        return absl::PermissionDeniedError(
            absl::StrCat("module path ", shown, " left the allowed root ",
                         r.root, " while it was being opened; refusing it"));
      }
      if (r.err == EACCES || r.err == EPERM) {
        return absl::PermissionDeniedError(absl::StrCat(
            "permission denied opening module \"", r.real, "\"", who,
            ": the caller cannot search a directory on the way or read the "
            "file; the daemon reads paths only on behalf of callers who "
            "could read them themselves"));
      }
      return absl::NotFoundError(absl::StrCat("cannot open module \"", r.real,
                                              "\"", who, ": ",
                                              std::strerror(r.err)));
    case PathOpen::kNotRegular:
      return absl::InvalidArgumentError(
          absl::StrCat("module path \"", r.real, "\" is ", FileTypeName(r.mode),
                       ", not a regular file; pass the compiled .so file"));
    case PathOpen::kCredentials:
      return absl::InternalError(absl::StrCat(
          "the open helper could not take the credentials of uid ", peer.uid,
          " gid ", peer.gid, ": ", std::strerror(r.err)));
    case PathOpen::kOpened:
      break;
  }
  return absl::OkStatus();
}

// The loader names a module by its digest ("module sha256:<hex>"); add the
// name the caller knows it by to this request's module (`digest`) only:
// "module \"libdemo.so\" (sha256:<hex>)". Another module the message names
// (the one a target is bound to) keeps its bare digest.
absl::Status NameTheModule(const absl::Status& status,
                           const std::string& display,
                           const std::string& digest) {
  const std::string at = absl::StrCat("module ", digest);
  std::string message(status.message());
  size_t pos = message.find(at);
  if (display.empty() || pos == std::string::npos) return status;
  message.replace(
      pos, at.size(),
      absl::StrCat("module ", QuoteForMessage(display), " (", digest, ")"));
  return absl::Status(status.code(), message);
}

absl::Status CheckElf(const std::string& bytes, const std::string& origin) {
  if (bytes.size() < 4 || bytes.compare(0, 4,
                                        "\x7f"
                                        "ELF") != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "module from ", origin,
        " is not an ELF shared library (it does not start with \\x7fELF); "
        "pass the compiled .so, not its source or an archive"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadModuleForPeer(const std::string& path,
                                              const ModulePolicy& policy,
                                              const PeerCred& peer) {
  KREG_RETURN_IF_ERROR(ValidateModulePath(path));
  // Root may read anything; the daemon's own uid reads as itself. Another
  // uid: its own credentials in the helper when kregd is root, else the
  // mode bits along the path.
  const bool trusted = peer.uid == 0 || peer.uid == ::geteuid();
  const bool as_caller =
      !trusted && ::geteuid() == 0 && !policy.open_helper.empty();
  PathOpen r;
  if (as_caller) {
    KREG_ASSIGN_OR_RETURN(
        r, OpenModulePathAs(policy.open_helper, path, policy.allowed_roots,
                            peer.uid, peer.gid));
    bool beneath = false;
    for (const std::string& root : policy.allowed_roots) {
      beneath =
          beneath || (root == r.root && (root == "/" || r.real == root ||
                                         absl::StartsWith(r.real, root + "/")));
    }
    if (r.stage == PathOpen::kOpened && !beneath) {
      return absl::InternalError(absl::StrCat(
          "the open helper opened \"", r.real, "\" under \"", r.root,
          "\", which is not an allowed root; refusing it"));
    }
  } else {
    r = OpenModulePath(path, policy.allowed_roots);
  }
  if (r.stage != PathOpen::kOpened) {
    return PathOpenError(r, path, policy, peer, as_caller);
  }
  if (!trusted && !as_caller) {
    KREG_RETURN_IF_ERROR(CheckModeBitsAlongPath(r.real, peer));
  }
  struct stat st;
  if (::fstat(r.fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InternalError(absl::StrCat("module \"", r.real,
                                            "\" is not a regular file after "
                                            "opening it"));
  }
  const std::string& real = r.real;
  if (static_cast<uint64_t>(st.st_size) > policy.max_module_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "module \"", real, "\" is ", st.st_size, " bytes; the limit is ",
        policy.max_module_bytes, " (max_module_bytes)"));
  }
  std::string bytes;
  KREG_RETURN_IF_ERROR(ReadAll(r.fd.get(), &bytes, policy.max_module_bytes,
                               absl::StrCat("module \"", real, "\"")));
  return bytes;
}

Registrar::Registrar(Registry* registry, ModulePolicy policy)
    : registry_(registry), policy_(std::move(policy)) {}

const char* RefusalReasonName(RefusalReason r) {
  switch (r) {
    case RefusalReason::kConflict:
      return "conflict";
    case RefusalReason::kInvalid:
      return "invalid";
    case RefusalReason::kQuota:
      return "quota";
    case RefusalReason::kPermission:
      return "permission";
    case RefusalReason::kUnavailable:
      return "unavailable";
    case RefusalReason::kOther:
      break;
  }
  return "other";
}

RefusalReason RefusalReasonOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kFailedPrecondition:
      return RefusalReason::kConflict;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kUnimplemented:
      return RefusalReason::kInvalid;
    case absl::StatusCode::kResourceExhausted:
      return RefusalReason::kQuota;
    case absl::StatusCode::kPermissionDenied:
      return RefusalReason::kPermission;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return RefusalReason::kUnavailable;
    default:
      return RefusalReason::kOther;
  }
}

void Registrar::CountRefusal(absl::StatusCode code) {
  refused_[static_cast<int>(RefusalReasonOf(code))].fetch_add(
      1, std::memory_order_relaxed);
}

RegistrationCounts Registrar::counts() const {
  RegistrationCounts c;
  c.created = created_.load(std::memory_order_relaxed);
  c.noop = noop_.load(std::memory_order_relaxed);
  for (int i = 0; i < kNumRefusalReasons; ++i) {
    c.refused[i] = refused_[i].load(std::memory_order_relaxed);
  }
  return c;
}

absl::StatusOr<RegisterOutcome> Registrar::Register(RegistrationRequest request,
                                                    const PeerCred& peer) {
  absl::StatusOr<RegisterArgs> args = Parse(request, peer);
  if (!args.ok()) {
    const absl::StatusCode code = args.status().code();
    if (request.source == RegistrationRequest::Source::kPath &&
        (code == absl::StatusCode::kPermissionDenied ||
         code == absl::StatusCode::kNotFound)) {
      // A path kregd may not read (outside its allowed roots, not the
      // caller's to read, not on this host): kreg then uploads the bytes,
      // so this is a step of a registration, not its refusal.
      spdlog::debug(
          "path registration of {} ({}) by uid {} pid {}: {}; "
          "the client may upload the bytes instead",
          QuoteForMessage(request.target_name),
          QuoteForMessage(request.platform), peer.uid, peer.pid,
          std::string(args.status().message()));
      return args.status();
    }
    return Refused(args.status(), request.target_name, request.platform, peer);
  }
  absl::StatusOr<RegisterOutcome> out = registry_->Register(*args);
  if (out.ok()) {
    (out->created ? created_ : noop_).fetch_add(1, std::memory_order_relaxed);
    return out;
  }
  CountRefusal(out.status().code());
  // How messages name the module: the path, else the client's file name.
  const std::string& display =
      request.source == RegistrationRequest::Source::kPath ? request.path
                                                           : request.file_name;
  return NameTheModule(out.status(), display, Sha256Digest(args->module_bytes));
}

absl::Status Registrar::Refused(absl::Status status,
                                const std::string& target_name,
                                const std::string& platform,
                                const PeerCred& peer) {
  CountRefusal(status.code());
  // The registry logs its own decisions; these are the edge's (rate-limited
  // per uid: a client can send bad requests at will).
  std::string suppressed;
  if (PeerLogLimiter().Allow(absl::StrCat("uid ", peer.uid), &suppressed)) {
    spdlog::info(
        "registration refused ({}): target {} ({}) by uid {} pid {}: {}{}",
        absl::StatusCodeToString(status.code()), QuoteForMessage(target_name),
        QuoteForMessage(platform), peer.uid, peer.pid,
        std::string(status.message()), suppressed);
  }
  return status;
}

absl::Status Registrar::PrecheckUpload(const std::string& target_name,
                                       const std::string& platform,
                                       uint64_t size, const PeerCred& peer) {
  absl::Status st = ValidateTargetName(target_name);
  absl::StatusOr<Platform> parsed = ParsePlatform(platform);
  if (st.ok() && !parsed.ok()) st = parsed.status();
  if (st.ok() && size > policy_.max_module_bytes) {
    st = absl::InvalidArgumentError(
        absl::StrCat("uploaded module is ", size, " bytes; the limit is ",
                     policy_.max_module_bytes, " (max_module_bytes)"));
  }
  if (st.ok())
    st = registry_->PrecheckUpload({target_name, *parsed}, size, peer);
  if (!st.ok()) return Refused(st, target_name, platform, peer);
  return absl::OkStatus();
}

absl::StatusOr<RegisterArgs> Registrar::Parse(RegistrationRequest& request,
                                              const PeerCred& peer) {
  KREG_RETURN_IF_ERROR(ValidateTargetName(request.target_name));
  KREG_ASSIGN_OR_RETURN(Platform platform, ParsePlatform(request.platform));
  KREG_ASSIGN_OR_RETURN(std::string func_name,
                        CanonicalFuncName(request.func_name));
  request.func_name = std::move(func_name);
  KREG_RETURN_IF_ERROR(request.compiled
                           ? ValidateContentId(request.content_id)
                           : ValidateClientContentId(request.content_id));

  RegisterArgs args;
  args.key = {request.target_name, platform};
  args.func_name = request.func_name;
  args.content_id = request.content_id;
  args.peer = peer;
  args.replace = request.replace;
  if (request.in_process) {
    if (request.content_id.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "in-process target \"", request.target_name,
          "\" needs a content_id (the callable's code fingerprint)"));
    }
    if (request.source != RegistrationRequest::Source::kNone) {
      return absl::InvalidArgumentError(absl::StrCat(
          "in-process target \"", request.target_name,
          "\" must not carry a module: it runs inside its own process"));
    }
    args.kind = TargetKind::kInProcess;
    args.origin = absl::StrCat("in-process:pid ", peer.pid);
    return args;
  }
  KREG_RETURN_IF_ERROR(ValidateModuleFileName(request.file_name));
  switch (request.source) {
    case RegistrationRequest::Source::kPath: {
      KREG_ASSIGN_OR_RETURN(args.module_bytes,
                            ReadModuleForPeer(request.path, policy_, peer));
      args.origin = absl::StrCat("path:", request.path);
      break;
    }
    case RegistrationRequest::Source::kUpload:
      if (request.upload_size > policy_.max_module_bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "uploaded module is ", request.upload_size, " bytes; the limit is ",
            policy_.max_module_bytes, " (max_module_bytes)"));
      }
      if (request.upload.size() != request.upload_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("upload announced ", request.upload_size,
                         " bytes but ", request.upload.size(), " arrived"));
      }
      args.module_bytes = std::move(request.upload);
      // A module kregd compiled is not the caller's upload: its origin
      // names the compile ("compile:k.cc, N bytes").
      args.origin =
          request.compiled
              ? absl::StrCat(
                    "compile:",
                    absl::StripPrefix(request.file_name, "compiled from "),
                    ", ", args.module_bytes.size(), " bytes")
              : absl::StrCat("upload:", args.module_bytes.size(), " bytes");
      break;
    case RegistrationRequest::Source::kNone:
      return absl::InvalidArgumentError(
          "the request names no module: set module.path or module.upload_size");
  }
  KREG_RETURN_IF_ERROR(CheckElf(args.module_bytes, args.origin));
  return args;
}

}  // namespace kreg
