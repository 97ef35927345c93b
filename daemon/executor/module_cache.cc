#include "daemon/executor/module_cache.h"

#include <dlfcn.h>
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "daemon/executor/ffi/ffi_host.h"

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

absl::StatusOr<void*> ModuleCache::ModuleOf(const std::string& digest,
                                            const UniqueFd& module_fd) {
  if (auto it = modules_.find(digest); it != modules_.end()) {
    return it->second.handle;
  }
  if (!module_fd.ok()) {
    return absl::InternalError(
        absl::StrCat("kregd sent no descriptor for module ", digest));
  }
  return Load(digest, module_fd.get());
}

absl::StatusOr<void*> ModuleCache::Symbol(void* handle,
                                          const std::string& digest,
                                          const std::string& name) {
  ::dlerror();
  void* sym = ::dlsym(handle, name.c_str());
  if (sym == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("symbol \"", name, "\" is not in module ", digest));
  }
  return sym;
}

absl::StatusOr<void*> ModuleCache::Handler(const std::string& digest,
                                           UniqueFd module_fd,
                                           const std::string& func_name) {
  absl::StatusOr<std::array<void*, kNumHandlerStages>> bundle =
      Bundle(digest, std::move(module_fd), func_name);
  if (!bundle.ok()) return bundle.status();
  return (*bundle)[kExecute];
}

absl::StatusOr<std::array<void*, kNumHandlerStages>> ModuleCache::Bundle(
    const std::string& digest, UniqueFd module_fd,
    const std::string& func_name) {
  HandlerSpec spec;
  std::string error;
  if (!ParseHandlerSpec(func_name, &spec, &error)) {
    return absl::InvalidArgumentError(error);
  }
  absl::MutexLock lock(&mu_);
  auto key = std::make_pair(digest, func_name);
  if (auto it = bundles_.find(key); it != bundles_.end()) return it->second;
  absl::StatusOr<void*> handle = ModuleOf(digest, module_fd);
  if (!handle.ok()) return handle.status();
  if (!spec.state_type.empty()) {
    absl::StatusOr<void*> id =
        Symbol(*handle, digest, spec.state_type.id_symbol);
    if (!id.ok()) return id.status();
    absl::StatusOr<void*> info =
        Symbol(*handle, digest, spec.state_type.info_symbol);
    if (!info.ok()) return info.status();
    XLA_FFI_Type_Register_Args args{};
    args.struct_size = XLA_FFI_Type_Register_Args_STRUCT_SIZE;
    args.name = XLA_FFI_ByteSpan{spec.state_type.name.data(),
                                 spec.state_type.name.size()};
    args.type_id = static_cast<XLA_FFI_TypeId*>(*id);
    args.type_info = static_cast<const XLA_FFI_TypeInfo*>(*info);
    absl::Status st = FfiHost::ErrorToStatus(
        HostedApi(), HostedApi()->XLA_FFI_Type_Register(&args));
    if (!st.ok()) return st;
  }
  std::array<void*, kNumHandlerStages> out{};
  for (int i = 0; i < kNumHandlerStages; ++i) {
    if (spec.stages[i].empty()) continue;
    absl::StatusOr<void*> sym = Symbol(*handle, digest, spec.stages[i]);
    if (!sym.ok()) return sym.status();
    out[i] = *sym;
  }
  bundles_[key] = out;
  return out;
}

size_t ModuleCache::size() const {
  absl::MutexLock lock(&mu_);
  return modules_.size();
}

}  // namespace kreg
