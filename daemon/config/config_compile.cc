// The compile service's part of kregd's configuration (DESIGN §13,
// docs/operator-guide.md "The compile service").
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "daemon/config/config.h"

namespace kreg {

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
