// The compile service's part of kregd's configuration (DESIGN §13,
// docs/operator-guide.md "The compile service").
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "daemon/config.h"
#include "toml++/toml.h"

#ifndef KREG_XLA_INCLUDE_DIR
#define KREG_XLA_INCLUDE_DIR ""
#endif

namespace kreg {

bool ApplyCompileKey(const std::string& path, const std::string& k,
                     const void* toml_node, Config* c, absl::Status* status) {
  const toml::node& value = *static_cast<const toml::node*>(toml_node);
  *status = absl::OkStatus();
  auto bad = [&](const std::string& want) {
    *status = absl::InvalidArgumentError(
        absl::StrCat("config file ", path, ": key \"", k, "\" must be ", want));
    return true;
  };
  if (k == "compile_cxx" || k == "compile_nvcc" ||
      k == "compile_ffi_include_dir" || k == "compile_binary") {
    auto s = value.value<std::string>();
    if (!s) return bad("a string");
    if (!s->empty() && (*s)[0] != '/') return bad("an absolute path");
    (k == "compile_cxx"      ? c->compile_cxx
     : k == "compile_nvcc"   ? c->compile_nvcc
     : k == "compile_binary" ? c->compile_binary
                             : c->compile_ffi_include_dir) = *s;
    return true;
  }
  if (k == "compile_timeout_s") {
    auto d = value.value<double>();
    if (!d || *d <= 0 || *d > 86400) {
      return bad("a number of seconds > 0 and at most 86400");
    }
    c->compile_timeout_s = *d;
    return true;
  }
  if (k == "max_parallel_compiles" || k == "compile_cpu_s" ||
      k == "compile_max_processes") {
    auto n = value.value<int64_t>();
    const bool zero_ok = k == "max_parallel_compiles";
    if (!n || *n < (zero_ok ? 0 : 1) || *n > 100000) {
      return bad(zero_ok ? "a whole number from 0 (half the cores) to 100000"
                         : "a whole number from 1 to 100000");
    }
    if (k == "max_parallel_compiles") c->max_parallel_compiles = *n;
    if (k == "compile_cpu_s") c->compile_cpu_s = *n;
    if (k == "compile_max_processes") c->compile_max_processes = *n;
    return true;
  }
  if (k == "compile_memory_bytes" || k == "compile_output_bytes" ||
      k == "compile_cache_bytes") {
    auto n = value.value<int64_t>();
    const bool zero_ok = k == "compile_cache_bytes";
    if (!n || *n < (zero_ok ? 0 : 1 << 20)) {
      return bad(zero_ok ? "a number of bytes >= 0 (0: unbounded)"
                         : "a number of bytes of at least 1048576 (1 MiB)");
    }
    if (k == "compile_memory_bytes") c->compile_memory_bytes = *n;
    if (k == "compile_output_bytes") c->compile_output_bytes = *n;
    if (k == "compile_cache_bytes") c->compile_cache_bytes = *n;
    return true;
  }
  return false;
}

std::string CompileFfiIncludeDir(const Config& c) {
  return c.compile_ffi_include_dir.empty() ? KREG_XLA_INCLUDE_DIR
                                           : c.compile_ffi_include_dir;
}

std::string CompileNvcc(const Config& c) {
  if (!c.compile_nvcc.empty()) return c.compile_nvcc;
  if (const char* path = std::getenv("PATH")) {
    for (absl::string_view dir : absl::StrSplit(path, ':', absl::SkipEmpty())) {
      std::string candidate = absl::StrCat(dir, "/nvcc");
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
  }
  if (::access("/usr/local/cuda/bin/nvcc", X_OK) == 0) {
    return "/usr/local/cuda/bin/nvcc";
  }
  return "";
}

}  // namespace kreg
