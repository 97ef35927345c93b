#include "daemon/executor/elf_symbols.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>

#include "catch2/catch.hpp"

namespace kreg {
namespace {

std::string ReadRunfile(const std::string& relative) {
  std::ifstream in(relative, std::ios::binary);
  REQUIRE(in);
  return {std::istreambuf_iterator<char>(in), {}};
}

TEST_CASE("HandlerLikeExports lists a module's C functions", "[elf]") {
  std::string image = ReadRunfile("kernels/cpu/libdemo.so");
  auto names = HandlerLikeExports(image);
  REQUIRE(names.ok());
  CHECK(std::find(names->begin(), names->end(), "Scale") != names->end());
  CHECK(std::find(names->begin(), names->end(), "AddMul") != names->end());
  for (const std::string& n : *names) {
    INFO(n);
    CHECK(n.rfind("_Z", 0) != 0);
    CHECK(n[0] != '_');
  }
}

TEST_CASE("HandlerLikeExports refuses what is not a sound ELF", "[elf]") {
  std::string image = ReadRunfile("kernels/cpu/libdemo.so");
  CHECK(HandlerLikeExports("#include <x.h>").status().code() ==
        absl::StatusCode::kInvalidArgument);
  // Every truncation fails cleanly or lists fewer names; none crashes.
  for (size_t cut :
       {size_t{16}, size_t{64}, image.size() / 2, image.size() - 1}) {
    INFO(cut);
    auto r = HandlerLikeExports(absl::string_view(image).substr(0, cut));
    if (r.ok()) CHECK(r->size() < 100000);
  }
  // Section offsets pointing anywhere: still no crash.
  for (size_t pos : {size_t{0x28}, size_t{0x3c}, size_t{0x3e}}) {
    std::string bad = image;
    for (size_t i = 0; i < 4 && pos + i < bad.size(); ++i)
      bad[pos + i] = '\xff';
    auto r = HandlerLikeExports(bad);
    CHECK((r.ok() || r.status().code() == absl::StatusCode::kInvalidArgument));
  }
}

TEST_CASE("ClosestFirst orders by edit distance, then name", "[elf]") {
  CHECK(EditDistance("Scale", "scale") == 0);
  CHECK(EditDistance("Scal", "Scale") == 1);
  CHECK(EditDistance("", "abc") == 3);
  std::vector<std::string> names = {"AddMul",     "Accumulate", "Scale",
                                    "ScratchSum", "AsyncScale", "Fail"};
  std::vector<std::string> best = ClosestFirst(names, "Scael", 3);
  REQUIRE(best.size() == 3);
  CHECK(best[0] == "Scale");
  CHECK(ClosestFirst(names, "x", 100).size() == names.size());
  CHECK(ClosestFirst({}, "x", 10).empty());
}

}  // namespace
}  // namespace kreg
