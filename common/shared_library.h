// Loading a shared object and finding its symbols, for every place that
// does it: the executors' module cache (daemon/executor/module_cache.cc),
// kregd-probe (daemon/executor/probe_main.cc), the shim's local execution
// (client/shim/local_bind.cc) and the CUDA driver (common/cuda_driver.cc).
// Std only: the shim links no absl (client/shim/BUILD).
#ifndef KREGD_COMMON_SHARED_LIBRARY_H_
#define KREGD_COMMON_SHARED_LIBRARY_H_

#include <array>
#include <string>

#include "common/handler_spec.h"

namespace kreg {

// dlopen(path, flags): the handle, or null with `*error` set to dlerror()'s
// text (which names the path and why), or "dlopen of PATH failed".
void* OpenLibrary(const std::string& path, int flags, std::string* error);

// dlsym(handle, name) with dlerror() cleared first; null when `handle`
// exports no `name`.
void* FindSymbol(void* handle, const std::string& name);

// The symbols of a handler bundle (common/handler_spec.h) in one library.
struct BundleSymbols {
  std::array<void*, kNumHandlerStages> stages{};  // null where none
  void* state_type_id = nullptr;                  // null: no state type
  void* state_type_info = nullptr;
};

// Finds every symbol `spec` names in `handle` (its state type's first, then
// the stages in order): "" when all are there, else the name of the first
// missing one.
std::string FindBundle(void* handle, const HandlerSpec& spec,
                       BundleSymbols* out);

}  // namespace kreg

#endif  // KREGD_COMMON_SHARED_LIBRARY_H_
