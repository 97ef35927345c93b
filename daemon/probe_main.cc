// kregd-probe: loads one module and makes XLA FFI's metadata call on one
// symbol, in a process of its own, so that a crashing constructor or a symbol
// that is not a handler cannot take the daemon down. Prints one report line
// (see module_loader.cc) and exits 0, or dies trying.
#include <dlfcn.h>

#include <cstdio>

#include "absl/status/statusor.h"
#include "daemon/ffi/ffi_host.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: kregd-probe MODULE SYMBOL\n");
    return 2;
  }
  void* handle = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    std::printf("error 3 cannot be loaded: %s\n", dlerror());
    return 0;
  }
  void* symbol = dlsym(handle, argv[2]);
  if (symbol == nullptr) {
    std::printf("error 5 the module exports no symbol \"%s\"\n", argv[2]);
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
