#include "daemon/compile_service/compile_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/unique_fd.h"
#include "daemon/base/files.h"
#include "daemon/compile_service/compile_request.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

struct Entry {
  int64_t mtime_ns;
  std::string path;
  uint64_t size;
};

std::vector<Entry> ListEntries(const std::string& dir) {
  std::vector<Entry> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (!absl::EndsWith(name, ".so") || name[0] == '.') continue;
    std::string path = dir + "/" + name;
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    out.push_back({st.st_mtim.tv_sec * 1000000000ll + st.st_mtim.tv_nsec, path,
                   static_cast<uint64_t>(st.st_size)});
  }
  ::closedir(d);
  return out;
}

}  // namespace

CompileCache::CompileCache(std::string dir, uint64_t max_bytes)
    : dir_(std::move(dir)), max_bytes_(max_bytes) {}

absl::Status CompileCache::Init() {
  if (::mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoError("cannot create compile cache", dir_);
  }
  return absl::OkStatus();
}

std::string CompileCache::PathOf(const std::string& key) const {
  return absl::StrCat(dir_, "/", KeyHex(key), ".so");
}

std::optional<std::string> CompileCache::Get(const std::string& key) {
  absl::MutexLock lock(&mu_);
  const std::string path = PathOf(key);
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.ok()) return std::nullopt;
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  std::string bytes;
  const size_t size = static_cast<size_t>(st.st_size);
  if (!ReadAll(fd.get(), &bytes, size, path).ok() || bytes.size() != size) {
    return std::nullopt;
  }
  ::futimens(fd.get(), nullptr);  // most recently used now
  return bytes;
}

absl::Status CompileCache::Put(const std::string& key,
                               const std::string& module) {
  absl::MutexLock lock(&mu_);
  KREG_RETURN_IF_ERROR(WriteFileAtomically(PathOf(key), module, 0600));
  if (max_bytes_ > 0) TrimLocked(max_bytes_);
  return absl::OkStatus();
}

CompileCacheTrim CompileCache::TrimTo(uint64_t target_bytes) {
  absl::MutexLock lock(&mu_);
  return TrimLocked(target_bytes);
}

CompileCacheTrim CompileCache::TrimLocked(uint64_t target_bytes) {
  std::vector<Entry> entries = ListEntries(dir_);
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.mtime_ns, a.path) < std::tie(b.mtime_ns, b.path);
  });
  uint64_t total = 0;
  for (const Entry& e : entries) total += e.size;
  CompileCacheTrim out;
  for (const Entry& e : entries) {
    if (total > target_bytes && ::unlink(e.path.c_str()) == 0) {
      total -= e.size;
      ++out.removed.files;
      out.removed.bytes += e.size;
      spdlog::info("compile cache: evicted {} ({} bytes)", e.path, e.size);
    } else {
      ++out.kept.files;
      out.kept.bytes += e.size;
    }
  }
  return out;
}

CompileCacheUsage CompileCache::Usage() {
  absl::MutexLock lock(&mu_);
  CompileCacheUsage u;
  for (const Entry& e : ListEntries(dir_)) {
    ++u.files;
    u.bytes += e.size;
  }
  return u;
}

}  // namespace kreg
