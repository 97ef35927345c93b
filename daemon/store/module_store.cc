#include "daemon/store/module_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/unique_fd.h"
#include "daemon/base/files.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

constexpr absl::string_view kPrefix = "sha256:";
// Files being written for a registration that is not accepted yet.
constexpr absl::string_view kTempPrefix = ".tmp-";

// Removes temp files in `dir` and, when `keep` is given, store files
// ("sha256-<hex>.so") whose digest is not in it; adds to the counters.
absl::Status Sweep(const std::string& dir, const std::set<std::string>* keep,
                   uint64_t* files, uint64_t* bytes, uint64_t* kept_files,
                   uint64_t* kept_bytes) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoError("cannot list module store", dir);
  absl::Status st;
  while (dirent* ent = ::readdir(d)) {
    absl::string_view name = ent->d_name;
    bool temp = absl::StartsWith(name, kTempPrefix);
    bool stored =
        absl::StartsWith(name, "sha256-") && absl::EndsWith(name, ".so");
    if (!temp && !(stored && keep != nullptr)) continue;
    struct stat sb;
    if (::fstatat(::dirfd(d), ent->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISREG(sb.st_mode)) {
      continue;
    }
    std::string digest;
    if (stored) {
      name.remove_prefix(7);
      name.remove_suffix(3);
      digest = absl::StrCat(kPrefix, name);
    }
    if (stored && keep->count(digest) != 0) {
      if (kept_files != nullptr) ++*kept_files;
      if (kept_bytes != nullptr) *kept_bytes += sb.st_size;
      continue;
    }
    if (::unlinkat(::dirfd(d), ent->d_name, 0) != 0) {
      st = ErrnoError("cannot remove", absl::StrCat(dir, "/", ent->d_name));
      continue;
    }
    ++*files;
    *bytes += static_cast<uint64_t>(sb.st_size);
  }
  ::closedir(d);
  return st;
}

}  // namespace

ModuleStore::ModuleStore(std::string dir) : dir_(std::move(dir)) {}

absl::Status ModuleStore::Init() {
  if (::mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoError("cannot create module store", dir_);
  }
  // Only temp files: every store file may be referenced by the journal.
  uint64_t files = 0, bytes = 0;
  absl::Status st = Sweep(dir_, nullptr, &files, &bytes, nullptr, nullptr);
  if (st.ok() && files > 0) {
    spdlog::info(
        "module store {}: removed {} temp files ({} bytes) left by "
        "an interrupted registration",
        dir_, files, bytes);
  }
  return st;
}

std::string ModuleStore::PathOf(const std::string& digest) const {
  std::string hex = digest;
  if (absl::StartsWith(hex, kPrefix)) hex = hex.substr(kPrefix.size());
  return absl::StrCat(dir_, "/sha256-", hex, ".so");
}

absl::StatusOr<std::string> ModuleStore::WriteTemp(const std::string& bytes,
                                                   const std::string&) {
  return WriteTempFile(dir_, "module", bytes, 0500);
}

absl::Status ModuleStore::CommitTemp(const std::string& temp_path,
                                     const std::string& digest) {
  return CommitTempFile(temp_path, PathOf(digest));
}

absl::Status ModuleStore::Put(const std::string& bytes,
                              const std::string& digest) {
  if (Verify(digest).ok()) return absl::OkStatus();
  KREG_ASSIGN_OR_RETURN(std::string tmp, WriteTemp(bytes, digest));
  return CommitTemp(tmp, digest);
}

absl::Status ModuleStore::RemoveUnreferenced(const std::set<std::string>& keep,
                                             uint64_t* files, uint64_t* bytes,
                                             uint64_t* kept_files,
                                             uint64_t* kept_bytes) {
  *files = *bytes = *kept_files = *kept_bytes = 0;
  absl::Status st = Sweep(dir_, &keep, files, bytes, kept_files, kept_bytes);
  if (st.ok() && *files > 0) st = SyncDir(dir_);
  return st;
}

absl::StatusOr<UniqueFd> ModuleStore::SealedCopy(const std::string& digest,
                                                 uint64_t max_bytes,
                                                 bool tamper_for_test) const {
  const std::string path = PathOf(digest);
  UniqueFd in(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!in.ok()) {
    spdlog::error("opening store copy {}: {}", path, std::strerror(errno));
    return absl::UnavailableError(
        absl::StrCat("the store copy of module ", digest,
                     " cannot be opened; see kregd's log"));
  }
  struct stat st;
  if (::fstat(in.get(), &st) != 0) return ErrnoError("cannot stat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::DataLossError(
        absl::StrCat("module store entry ", path, " is not a regular file"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size == 0 || size > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "module ", digest, " has ", size, " bytes in the store; a module for ",
        "local execution must have 1 to ", max_bytes,
        " bytes (max_module_bytes)"));
  }
  std::string label = absl::StrCat(
      "kreg-module-", digest.size() > 7 ? digest.substr(7, 16) : "unknown");
  UniqueFd out(::memfd_create(label.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!out.ok()) return ErrnoError("memfd_create for", path);
  if (::ftruncate(out.get(), static_cast<off_t>(size)) != 0) {
    return ErrnoError("cannot size the memfd copy of", path);
  }
  off_t offset = 0;
  while (static_cast<uint64_t>(offset) < size) {
    ssize_t n = ::sendfile(out.get(), in.get(), &offset,
                           static_cast<size_t>(size - offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("cannot copy", path);
    if (n == 0) {
      return absl::DataLossError(absl::StrCat("module store file ", path,
                                              " shrank while it was copied"));
    }
  }
  void* map =
      ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, out.get(), 0);
  if (map == MAP_FAILED)
    return ErrnoError("cannot map the memfd copy of", path);
  std::string actual = Sha256Digest({static_cast<const char*>(map), size});
  if (actual == digest && tamper_for_test) {
    static_cast<unsigned char*>(map)[size - 1] ^= 0xff;
  }
  ::munmap(map, size);
  if (actual != digest) {
    return absl::DataLossError(absl::StrCat(
        "module store file ", path, " is corrupt: its content is ", actual,
        " but it is stored as ", digest,
        "; restore it from a backup or re-register the module's bytes"));
  }
  if (::fcntl(out.get(), F_ADD_SEALS, kLocalModuleSeals) != 0) {
    return ErrnoError("cannot seal the memfd copy of", path);
  }
  return out;
}

absl::Status ModuleStore::Verify(const std::string& digest) const {
  std::string path = PathOf(digest);
  KREG_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path, SIZE_MAX));
  std::string actual = Sha256Digest(bytes);
  if (actual != digest) {
    return absl::DataLossError(absl::StrCat(
        "module store file ", path, " is corrupt: its content is ", actual,
        " but it is stored as ", digest,
        "; restore it from a backup or re-register the module's bytes"));
  }
  return absl::OkStatus();
}

}  // namespace kreg
