// common/shared_library.h over libc (always loaded) and a path that is not
// a library.
#include "common/shared_library.h"

#include <dlfcn.h>

#include <string>

#include "catch2/catch.hpp"

namespace kreg {
namespace {

TEST_CASE("OpenLibrary says why a path cannot be loaded", "[shared_library]") {
  std::string error;
  CHECK(OpenLibrary("/nonexistent/libkreg-missing.so", RTLD_NOW, &error) ==
        nullptr);
  CHECK(error.find("/nonexistent/libkreg-missing.so") != std::string::npos);
  CHECK(error.find("No such file") != std::string::npos);

  error.clear();
  CHECK(OpenLibrary("/etc/passwd", RTLD_NOW, &error) == nullptr);
  CHECK(error.find("/etc/passwd") != std::string::npos);
}

TEST_CASE("FindSymbol finds an export and returns null for a missing one",
          "[shared_library]") {
  std::string error;
  void* libc = OpenLibrary("libc.so.6", RTLD_NOW | RTLD_LOCAL, &error);
  REQUIRE(libc != nullptr);
  CHECK(error.empty());
  CHECK(FindSymbol(libc, "malloc") != nullptr);
  CHECK(FindSymbol(libc, "kreg_no_such_symbol") == nullptr);
}

TEST_CASE("FindBundle names the first missing symbol, state type first",
          "[shared_library]") {
  std::string error;
  void* libc = OpenLibrary("libc.so.6", RTLD_NOW | RTLD_LOCAL, &error);
  REQUIRE(libc != nullptr);
  HandlerSpec spec;
  spec.stages[kExecute] = "malloc";
  spec.stages[kInstantiate] = "calloc";
  BundleSymbols found;
  CHECK(FindBundle(libc, spec, &found).empty());
  CHECK(found.stages[kExecute] == FindSymbol(libc, "malloc"));
  CHECK(found.stages[kInstantiate] == FindSymbol(libc, "calloc"));
  CHECK(found.stages[kPrepare] == nullptr);
  CHECK(found.state_type_id == nullptr);

  spec.stages[kPrepare] = "kreg_missing_prepare";
  CHECK(FindBundle(libc, spec, &found) == "kreg_missing_prepare");

  spec.state_type = {"my_state", "free", "kreg_missing_info"};
  CHECK(FindBundle(libc, spec, &found) == "kreg_missing_info");
  CHECK(found.state_type_id == FindSymbol(libc, "free"));
}

}  // namespace
}  // namespace kreg
