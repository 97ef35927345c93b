#include "common/handler_spec.h"

#include <string>

#include "catch2/catch.hpp"

namespace kreg {
namespace {

std::string ErrorOf(const std::string& text) {
  HandlerSpec spec;
  std::string error;
  CHECK_FALSE(ParseHandlerSpec(text, &spec, &error));
  return error;
}

TEST_CASE("A plain symbol is an execute-only target", "[handler_spec]") {
  HandlerSpec spec;
  std::string error;
  REQUIRE(ParseHandlerSpec("Scale", &spec, &error));
  CHECK(spec.execute() == "Scale");
  CHECK_FALSE(spec.IsBundle());
  CHECK(spec.Format() == "Scale");
}

TEST_CASE("A bundle has one canonical spelling", "[handler_spec]") {
  HandlerSpec a, b;
  std::string error;
  REQUIRE(ParseHandlerSpec("execute=E;state_type=my.T/TId/TInfo;instantiate=I",
                           &a, &error));
  REQUIRE(ParseHandlerSpec("instantiate=I;execute=E;state_type=my.T/TId/TInfo",
                           &b, &error));
  CHECK(a.Format() == "instantiate=I;execute=E;state_type=my.T/TId/TInfo");
  CHECK(a.Format() == b.Format());
  CHECK(a.IsBundle());
  CHECK(a.stages[kInstantiate] == "I");
  CHECK(a.state_type.id_symbol == "TId");
  // "execute=E" alone is the plain target "E".
  REQUIRE(ParseHandlerSpec("execute=E", &a, &error));
  CHECK(a.Format() == "E");
}

TEST_CASE("Bad bundles are refused naming the stage and symbol",
          "[handler_spec]") {
  CHECK(ErrorOf("execute=E;record=R") ==
        "unknown stage \"record\" (for symbol \"R\"); the stages are "
        "instantiate, prepare, initialize and execute (XLA FFI's record "
        "stage is not supported)");
  CHECK(ErrorOf("instantiate=I") ==
        "the handler bundle has no execute function (given: instantiate=I); "
        "XLA requires one: add execute=SYMBOL");
  CHECK(ErrorOf("execute=E;execute=F") ==
        "stage execute is given twice (\"E\" and \"F\"); name one function "
        "per stage");
  CHECK(ErrorOf("execute=E;prepare=2x")
            .find("the prepare function \"2x\" is not a C symbol name") == 0);
  CHECK(ErrorOf("execute=E;oops").find("handler bundle entry \"oops\"") == 0);
  CHECK(ErrorOf("execute=E;state_type=T/Id")
            .find("state_type \"T/Id\" is not "
                  "NAME/TYPE_ID_SYMBOL/TYPE_INFO_SYMBOL") == 0);
  CHECK(ErrorOf("execute=E;state_type=T/Id/a-b")
            .find("the state type's XLA_FFI_TypeInfo symbol \"a-b\"") == 0);
  CHECK(ErrorOf("execute=E;state_type=bad name/Id/Info")
            .find("state type name \"bad name\"") == 0);
  CHECK(ErrorOf("2x").find("function name \"2x\" is not a C symbol") == 0);
  CHECK(ErrorOf("").find("function name \"\"") == 0);
}

TEST_CASE("A spec built field by field is checked", "[handler_spec]") {
  HandlerSpec spec;
  spec.stages[kInstantiate] = "I";
  CHECK(spec.Check().find("no execute function") != std::string::npos);
  spec.stages[kExecute] = "E";
  CHECK(spec.Check().empty());
  spec.state_type = {"T", "Id", ""};
  CHECK(spec.Check().find("XLA_FFI_TypeInfo symbol \"\"") != std::string::npos);
}

}  // namespace
}  // namespace kreg
