// Fuzzes the ELF dynamic-symbol reader (elf_symbols.cc) with arbitrary bytes,
// and the "did you mean" ordering with the names it returns.
#include <cstdint>
#include <string>

#include "daemon/executor/elf_symbols.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view image(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::vector<std::string>> names =
      kreg::HandlerLikeExports(image);
  if (!names.ok()) return 0;
  for (const std::string& n : *names) {
    if (n.empty() || n[0] == '_') kreg::fuzz::Fail("not a C name: " + n);
  }
  std::string wanted = size > 8 ? std::string(image.substr(size - 8)) : "Scale";
  std::vector<std::string> best = kreg::ClosestFirst(*names, wanted, 5);
  if (best.size() > 5 || best.size() > names->size()) {
    kreg::fuzz::Fail("ClosestFirst returned too many names");
  }
  return 0;
}
