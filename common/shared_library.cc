#include "common/shared_library.h"

#include <dlfcn.h>

namespace kreg {

void* OpenLibrary(const std::string& path, int flags, std::string* error) {
  void* handle = ::dlopen(path.c_str(), flags);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    *error = why != nullptr ? why : "dlopen of " + path + " failed";
  }
  return handle;
}

void* FindSymbol(void* handle, const std::string& name) {
  ::dlerror();
  return ::dlsym(handle, name.c_str());
}

std::string FindBundle(void* handle, const HandlerSpec& spec,
                       BundleSymbols* out) {
  const StateTypeSpec& type = spec.state_type;
  if (!type.empty()) {
    out->state_type_id = FindSymbol(handle, type.id_symbol);
    if (out->state_type_id == nullptr) return type.id_symbol;
    out->state_type_info = FindSymbol(handle, type.info_symbol);
    if (out->state_type_info == nullptr) return type.info_symbol;
  }
  for (int i = 0; i < kNumHandlerStages; ++i) {
    if (spec.stages[i].empty()) continue;
    out->stages[i] = FindSymbol(handle, spec.stages[i]);
    if (out->stages[i] == nullptr) return spec.stages[i];
  }
  return "";
}

}  // namespace kreg
