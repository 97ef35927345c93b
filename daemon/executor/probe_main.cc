// kregd-probe: kregd's helper process, so that nothing a client chose runs
// or blocks inside the daemon. Two modes:
//   kregd-probe MODULE SYMBOL: loads one module and makes XLA FFI's metadata
//     call on one symbol, so that a crashing constructor or a symbol that is
//     not a handler cannot take the daemon down. Prints one report line (see
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

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "--open-as") == 0) {
    return kreg::ServeOpenAs(argc, argv);
  }
  if (argc != 3) {
    std::fprintf(stderr,
                 "usage: kregd-probe MODULE SYMBOL\n"
                 "       kregd-probe --open-as UID GID PATH ROOT...\n");
    return 2;
  }
  void* handle = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    std::printf("error 3 cannot be loaded: %s\n", dlerror());
    return 0;
  }
  void* symbol = dlsym(handle, argv[2]);
  if (symbol == nullptr) {
    std::printf("error 3 the module exports no symbol \"%s\"%s\n", argv[2],
                ExportedFunctions(argv[1], argv[2]).c_str());
    return 0;
  }
  absl::StatusOr<kreg::HandlerInfo> info = kreg::QueryHandlerMetadata(symbol);
  if (!info.ok()) {
    std::printf("error %d %s\n", static_cast<int>(info.status().code()),
                std::string(info.status().message()).c_str());
    return 0;
  }
  std::printf("ok %u %u %u %lld\n", info->api_major, info->api_minor,
              info->traits, static_cast<long long>(info->state_type_id));
  return 0;
}
