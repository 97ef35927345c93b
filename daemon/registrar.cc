#include "daemon/registrar.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/unique_fd.h"
#include "daemon/validate.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

bool UnderRoot(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  return path == root || absl::StartsWith(path, root + "/");
}

// Whether `peer` may read a file with `st`'s owner and mode (the peer's
// primary group only: SO_PEERCRED carries no supplementary groups).
bool PeerMayRead(const struct stat& st, const PeerCred& peer) {
  if (peer.uid == 0) return true;
  if (st.st_uid == peer.uid) return (st.st_mode & S_IRUSR) != 0;
  if (st.st_gid == peer.gid) return (st.st_mode & S_IRGRP) != 0;
  return (st.st_mode & S_IROTH) != 0;
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

UniqueFd OpenBeneath(const std::string& root, const std::string& path) {
  UniqueFd dir(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (dir.ok()) {
    std::string rel = root == "/"
                          ? path.substr(1)
                          : path.substr(std::min(path.size(), root.size() + 1));
    if (rel.empty()) rel = ".";
    open_how how{};
    how.flags = O_RDONLY | O_CLOEXEC | O_NOFOLLOW;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    long fd = ::syscall(SYS_openat2, dir.get(), rel.c_str(), &how, sizeof(how));
    if (fd >= 0 || errno != ENOSYS) return UniqueFd(static_cast<int>(fd));
  }
  return UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
}

absl::StatusOr<std::string> ReadModuleForPeer(const std::string& path,
                                              const ModulePolicy& policy,
                                              const PeerCred& peer) {
  if (path.empty() || path[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "module path \"", path,
        "\" is not absolute; the daemon resolves paths on its own host"));
  }
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "module path \"", path,
        "\" cannot be resolved on the daemon's host: ", std::strerror(errno)));
  }
  std::string real = resolved;
  const std::string* root_of = nullptr;
  for (const std::string& root : policy.allowed_roots) {
    if (root_of == nullptr && UnderRoot(real, root)) root_of = &root;
  }
  if (root_of == nullptr) {
    std::string roots;
    for (const std::string& r : policy.allowed_roots) {
      absl::StrAppend(&roots, roots.empty() ? "" : ", ", r);
    }
    return absl::PermissionDeniedError(absl::StrCat(
        "module path \"", path, "\" resolves to \"", real,
        "\", which is outside the daemon's allowed roots [", roots,
        "]; upload the bytes instead or ask the operator to add a root "
        "(--allow-root)"));
  }
  UniqueFd fd = OpenBeneath(*root_of, real);
  if (!fd.ok() && (errno == EXDEV || errno == ELOOP)) {
    // The tree changed between realpath and open (a directory or link was
    // swapped to point outside the root): refuse, as for an escape.
    return absl::PermissionDeniedError(
        absl::StrCat("module path \"", path, "\" left the allowed root ",
                     *root_of, " while it was being opened; refusing it"));
  }
  struct stat st;
  if (!fd.ok() || ::fstat(fd.get(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("cannot open module \"", real,
                                            "\": ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("module path \"", real, "\" is not a regular file"));
  }
  if (!PeerMayRead(st, peer)) {
    return absl::PermissionDeniedError(
        absl::StrCat("module \"", real, "\" is not readable by uid ", peer.uid,
                     "; the daemon reads paths only on behalf of "
                     "callers who could read them themselves"));
  }
  if (static_cast<uint64_t>(st.st_size) > policy.max_module_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "module \"", real, "\" is ", st.st_size, " bytes; the limit is ",
        policy.max_module_bytes, " (max_module_bytes)"));
  }
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::read(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::InternalError(
          absl::StrCat("cannot read module \"", real, "\": short read"));
    }
    done += static_cast<size_t>(n);
  }
  return bytes;
}

Registrar::Registrar(Registry* registry, ModulePolicy policy)
    : registry_(registry), policy_(std::move(policy)) {}

absl::StatusOr<RegisterOutcome> Registrar::Register(
    const v1::RegisterTargetHeader& header, std::string upload,
    const PeerCred& peer) {
  absl::StatusOr<RegisterArgs> args = Parse(header, std::move(upload), peer);
  if (!args.ok()) {
    // The registry logs its own decisions; these are the edge's.
    spdlog::info(
        "registration refused ({}): target {} ({}) by uid {} pid {}: {}",
        absl::StatusCodeToString(args.status().code()),
        QuoteForMessage(header.target_name()),
        QuoteForMessage(header.platform()), peer.uid, peer.pid,
        std::string(args.status().message()));
    return args.status();
  }
  return registry_->Register(*args);
}

absl::StatusOr<RegisterArgs> Registrar::Parse(
    const v1::RegisterTargetHeader& header, std::string upload,
    const PeerCred& peer) {
  absl::Status st = ValidateTargetName(header.target_name());
  if (!st.ok()) return st;
  absl::StatusOr<Platform> platform = ParsePlatform(header.platform());
  if (!platform.ok()) return platform.status();
  st = ValidateFuncName(header.func_name());
  if (!st.ok()) return st;
  st = ValidateContentId(header.content_id());
  if (!st.ok()) return st;

  RegisterArgs args;
  args.key = {header.target_name(), *platform};
  args.func_name = header.func_name();
  args.content_id = header.content_id();
  args.peer = peer;
  args.replace = header.replace();
  if (header.in_process()) {
    if (header.content_id().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "in-process target \"", header.target_name(),
          "\" needs a content_id (the callable's code fingerprint)"));
    }
    if (header.module().source_case() != v1::ModuleSource::SOURCE_NOT_SET) {
      return absl::InvalidArgumentError(absl::StrCat(
          "in-process target \"", header.target_name(),
          "\" must not carry a module: it runs inside its own process"));
    }
    args.kind = TargetKind::kInProcess;
    args.origin = absl::StrCat("in-process:pid ", peer.pid);
    return args;
  }
  switch (header.module().source_case()) {
    case v1::ModuleSource::kPath: {
      absl::StatusOr<std::string> bytes =
          ReadModuleForPeer(header.module().path(), policy_, peer);
      if (!bytes.ok()) return bytes.status();
      args.module_bytes = *std::move(bytes);
      args.origin = absl::StrCat("path:", header.module().path());
      break;
    }
    case v1::ModuleSource::kUploadSize:
      if (header.module().upload_size() > policy_.max_module_bytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("uploaded module is ", header.module().upload_size(),
                         " bytes; the limit is ", policy_.max_module_bytes,
                         " (max_module_bytes)"));
      }
      if (upload.size() != header.module().upload_size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("upload announced ", header.module().upload_size(),
                         " bytes but ", upload.size(), " arrived"));
      }
      args.module_bytes = std::move(upload);
      args.origin = absl::StrCat("upload:", args.module_bytes.size(), " bytes");
      break;
    default:
      return absl::InvalidArgumentError(
          "the request names no module: set module.path or module.upload_size");
  }
  st = CheckElf(args.module_bytes, args.origin);
  if (!st.ok()) return st;
  return args;
}

}  // namespace kreg
