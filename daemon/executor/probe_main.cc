// kregd-probe: kregd's helper process, so that nothing a client chose runs
// or blocks inside the daemon. Two modes:
//   kregd-probe MODULE FUNCTION: loads one module and makes XLA FFI's
//     metadata call on one symbol, or on every stage of a handler bundle
//     (common/handler_spec.h) after registering its state type, so that a
//     crashing constructor or a symbol that is not a handler cannot take
//     the daemon down. Prints one report line (see
//     module_loader.cc) and exits 0, or dies trying.
//   kregd-probe --open-as UID GID PATH ROOT...: opens a daemon-side module
//     path with a caller's credentials and passes the descriptor back on
//     fd 3 (module_path.h).
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/handler_spec.h"
#include "daemon/base/module_path.h"
#include "daemon/executor/elf_symbols.h"
#include "daemon/executor/ffi/ffi_host.h"

namespace {

constexpr size_t kMaxSuggestions = 10;

// "; it exports these functions, closest first: A, B (N in all)" or why not.
std::string ExportedFunctions(const char* path, const char* wanted) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || ::fstat(fd, &st) != 0 || st.st_size <= 0) {
    if (fd >= 0) ::close(fd);
    return "";
  }
  void* map = ::mmap(nullptr, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return "";
  absl::StatusOr<std::vector<std::string>> names = kreg::HandlerLikeExports(
      absl::string_view(static_cast<const char*>(map), st.st_size));
  ::munmap(map, st.st_size);
  if (!names.ok()) return "";
  if (names->empty()) {
    return "; it exports no functions with C names (declare handlers with "
           "XLA_FFI_DEFINE_HANDLER_SYMBOL, which gives them C linkage)";
  }
  size_t total = names->size();
  std::vector<std::string> best =
      kreg::ClosestFirst(*std::move(names), wanted, kMaxSuggestions);
  return absl::StrCat("; it exports these functions, closest first: ",
                      absl::StrJoin(best, ", "),
                      total > best.size()
                          ? absl::StrCat(" (", total, " in all)")
                          : std::string());
}

// Registers the bundle's state type with kregd's host (XLA_FFI_Type_Register,
// as jax.ffi.register_ffi_type does in-process) so that the instantiate
// stage's metadata call can report its id. Empty, or the error to report.
std::string RegisterStateType(void* handle, const kreg::StateTypeSpec& type) {
  void* id = dlsym(handle, type.id_symbol.c_str());
  void* info = dlsym(handle, type.info_symbol.c_str());
  const char* missing = id == nullptr     ? type.id_symbol.c_str()
                        : info == nullptr ? type.info_symbol.c_str()
                                          : nullptr;
  if (missing != nullptr) {
    return absl::StrCat(
        "error 3 state type \"", type.name,
        "\": the module exports no symbol \"", missing,
        "\" (the data symbol of its XLA_FFI_TypeId or XLA_FFI_TypeInfo)");
  }
  XLA_FFI_Type_Register_Args args{};
  args.struct_size = XLA_FFI_Type_Register_Args_STRUCT_SIZE;
  args.name = XLA_FFI_ByteSpan{type.name.data(), type.name.size()};
  args.type_id = static_cast<XLA_FFI_TypeId*>(id);
  args.type_info = static_cast<const XLA_FFI_TypeInfo*>(info);
  absl::Status st = kreg::FfiHost::ErrorToStatus(
      kreg::HostedApi(), kreg::HostedApi()->XLA_FFI_Type_Register(&args));
  if (st.ok()) return "";
  return absl::StrCat("error 3 state type \"", type.name,
                      "\" cannot be registered: ", st.message());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "--open-as") == 0) {
    return kreg::ServeOpenAs(argc, argv);
  }
  if (argc != 3) {
    std::fprintf(stderr,
                 "usage: kregd-probe MODULE FUNCTION\n"
                 "       kregd-probe --open-as UID GID PATH ROOT...\n"
                 "FUNCTION: a symbol, or a handler bundle "
                 "(execute=A;instantiate=B;state_type=N/ID/INFO)\n");
    return 2;
  }
  kreg::HandlerSpec spec;
  std::string bad;
  if (!kreg::ParseHandlerSpec(argv[2], &spec, &bad)) {
    std::printf("error 3 %s\n", bad.c_str());
    return 0;
  }
  void* handle = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    std::printf("error 3 cannot be loaded: %s\n", dlerror());
    return 0;
  }
  if (!spec.state_type.empty()) {
    std::string error = RegisterStateType(handle, spec.state_type);
    if (!error.empty()) {
      std::printf("%s\n", error.c_str());
      return 0;
    }
  }
  // Execute first (XLA reads the API version and traits there), then the
  // other stages; the state type id is the instantiate stage's.
  constexpr int kOrder[] = {kreg::kExecute, kreg::kInstantiate, kreg::kPrepare,
                            kreg::kInitialize};
  kreg::HandlerInfo out;
  for (int stage : kOrder) {
    const std::string& name = spec.stages[stage];
    if (name.empty()) continue;
    const std::string prefix = spec.IsBundle()
                                   ? absl::StrCat(kreg::HandlerStageName(stage),
                                                  " function \"", name, "\": ")
                                   : std::string();
    void* symbol = dlsym(handle, name.c_str());
    if (symbol == nullptr) {
      std::printf("error 3 %sthe module exports no symbol \"%s\"%s\n",
                  prefix.c_str(), name.c_str(),
                  ExportedFunctions(argv[1], name.c_str()).c_str());
      return 0;
    }
    absl::StatusOr<kreg::HandlerInfo> info = kreg::QueryHandlerMetadata(symbol);
    if (!info.ok()) {
      std::printf("error %d %s%s\n", static_cast<int>(info.status().code()),
                  prefix.c_str(), std::string(info.status().message()).c_str());
      return 0;
    }
    if (stage == kreg::kExecute) {
      out = *info;
    } else if (stage == kreg::kInstantiate) {
      out.state_type_id = info->state_type_id;
    }
  }
  std::printf("ok %u %u %u %lld\n", out.api_major, out.api_minor, out.traits,
              static_cast<long long>(out.state_type_id));
  return 0;
}
