#include "daemon/executor/module_cache.h"

#include <dlfcn.h>
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>

#include "absl/strings/str_cat.h"

namespace kreg {

absl::StatusOr<void*> ModuleCache::Load(const std::string& digest,
                                        int module_fd) {
  struct stat st;
  if (::fstat(module_fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InternalError(absl::StrCat("the store copy of module ", digest,
                                            " is not a regular file"));
  }
  UniqueFd memfd(::memfd_create("kreg-module", MFD_CLOEXEC));
  if (!memfd.ok()) {
    return absl::InternalError(absl::StrCat("memfd_create for module ", digest,
                                            ": ", strerror(errno)));
  }
  off_t off = 0;
  while (off < st.st_size) {
    ssize_t n = ::sendfile(memfd.get(), module_fd, &off,
                           static_cast<size_t>(st.st_size - off));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::InternalError(
          absl::StrCat("copying module ", digest, " into the executor: ",
                       n < 0 ? strerror(errno) : "unexpected end of file"));
    }
  }
  std::string path = absl::StrCat("/proc/self/fd/", memfd.get());
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = ::dlerror();
    return absl::InternalError(absl::StrCat("dlopen of module ", digest,
                                            " failed: ", err ? err : "?"));
  }
  Module& m = modules_[digest];
  m.memfd = std::move(memfd);
  m.handle = handle;
  return handle;
}

absl::StatusOr<void*> ModuleCache::Handler(const std::string& digest,
                                           UniqueFd module_fd,
                                           const std::string& func_name) {
  absl::MutexLock lock(&mu_);
  auto key = std::make_pair(digest, func_name);
  if (auto it = handlers_.find(key); it != handlers_.end()) return it->second;
  void* handle = nullptr;
  if (auto it = modules_.find(digest); it != modules_.end()) {
    handle = it->second.handle;
  } else {
    if (!module_fd.ok()) {
      return absl::InternalError(
          absl::StrCat("kregd sent no descriptor for module ", digest));
    }
    absl::StatusOr<void*> loaded = Load(digest, module_fd.get());
    if (!loaded.ok()) return loaded.status();
    handle = *loaded;
  }
  ::dlerror();
  void* sym = ::dlsym(handle, func_name.c_str());
  if (sym == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("symbol \"", func_name, "\" is not in module ", digest));
  }
  handlers_[key] = sym;
  return sym;
}

size_t ModuleCache::size() const {
  absl::MutexLock lock(&mu_);
  return modules_.size();
}

}  // namespace kreg
