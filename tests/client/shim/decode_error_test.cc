#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "client/shim/forward.h"

namespace kreg {
namespace shim {
namespace {

// An XLA_FFI_Attrs over scalars named `names`, of dtypes `dtypes`.
struct Attrs {
  Attrs(std::vector<std::string> n, std::vector<XLA_FFI_DataType> d)
      : names(std::move(n)) {
    for (size_t i = 0; i < names.size(); ++i) {
      spans.push_back({names[i].data(), names[i].size()});
      scalars.push_back({d[i], &value});
      types.push_back(XLA_FFI_AttrType_SCALAR);
    }
    for (size_t i = 0; i < names.size(); ++i) {
      span_ptrs.push_back(&spans[i]);
      ptrs.push_back(&scalars[i]);
    }
    attrs.struct_size = XLA_FFI_Attrs_STRUCT_SIZE;
    attrs.extension_start = nullptr;
    attrs.size = static_cast<int64_t>(names.size());
    attrs.types = types.data();
    attrs.names = span_ptrs.data();
    attrs.attrs = ptrs.data();
  }
  std::vector<std::string> names;
  std::vector<XLA_FFI_ByteSpan> spans;
  std::vector<XLA_FFI_ByteSpan*> span_ptrs;
  std::vector<XLA_FFI_Scalar> scalars;
  std::vector<void*> ptrs;
  std::vector<XLA_FFI_AttrType> types;
  double value = 2;
  XLA_FFI_Attrs attrs;
};

const std::string kWrongScalar =
    "[execute] Failed to decode all FFI handler operands (bad operands at: "
    "1)\nDiagnostics:\nWrong scalar data type: expected F32 but got F64";

TEST_CASE("A wrong scalar type names the target and the attribute") {
  Attrs a({"factor", "n"}, {XLA_FFI_DataType_F64, XLA_FFI_DataType_S64});
  CHECK(ExplainDecodeError("ops.scale", "cpu", a.attrs, kWrongScalar) ==
        "kreg: target \"ops.scale\" (cpu): the handler could not decode its "
        "operands: attribute \"factor\" is F64 but the handler expects F32; "
        "pass a value of that type, e.g. np.float32(...). XLA FFI says: " +
            kWrongScalar);
}

TEST_CASE("Two attributes of the offending type are both named") {
  Attrs a({"a", "b"}, {XLA_FFI_DataType_F64, XLA_FFI_DataType_F64});
  CHECK_THAT(ExplainDecodeError("t", "cuda", a.attrs, kWrongScalar),
             Catch::StartsWith("kreg: target \"t\" (cuda): the handler could "
                               "not decode its operands: one of the "
                               "attributes \"a\", \"b\" (all F64) should be "
                               "F32; pass"));
}

TEST_CASE("Two mistyped attributes are named, not run together") {
  // XLA FFI joins its diagnostics with no separator.
  const std::string two =
      "[execute] Failed to decode all FFI handler operands (bad operands at: "
      "1, 2)\nDiagnostics:\nWrong scalar data type: expected F64 but got "
      "S64Wrong scalar data type: expected F64 but got S64";
  Attrs a({"lo", "hi"}, {XLA_FFI_DataType_S64, XLA_FFI_DataType_S64});
  const std::string explained = ExplainDecodeError("t.u", "cpu", a.attrs, two);
  CHECK_THAT(explained,
             Catch::StartsWith("kreg: target \"t.u\" (cpu): the handler could "
                               "not decode its operands: one of the "
                               "attributes \"lo\", \"hi\" (all S64) should "
                               "be F64; pass a value of that type, e.g. "
                               "np.float64(...). XLA FFI says: "));
  CHECK_THAT(explained, !Catch::Contains("S64Wrong but"));
}

TEST_CASE("A missing attribute names the target and what the call passes") {
  Attrs a({"lo"}, {XLA_FFI_DataType_F64});
  const std::string missing =
      "[execute] Wrong number of attributes: expected 2 but got 1 with "
      "name(s): lo";
  CHECK(ExplainDecodeError("t.u", "cpu", a.attrs, missing) ==
        "kreg: target \"t.u\" (cpu): the call passes a different number of "
        "attributes than the handler declares (this call passes \"lo\"); "
        "pass exactly the attributes the handler binds. XLA FFI says: " +
            missing);
  Attrs none({}, {});
  CHECK_THAT(ExplainDecodeError("t.u", "cpu", none.attrs,
                                "[execute] Wrong number of attributes: "
                                "expected 2 but got 0"),
             Catch::Contains("(this call passes none)"));
  CHECK_THAT(ExplainDecodeError("t.u", "cpu", none.attrs,
                                "[execute] Wrong number of arguments: "
                                "expected 1 but got 2"),
             Catch::StartsWith("kreg: target \"t.u\" (cpu): the call passes "
                               "a different number of arguments than the "
                               "handler declares; pass exactly the arguments"));
}

TEST_CASE("Other decoding failures get the target; other errors pass") {
  Attrs a({"cod"}, {XLA_FFI_DataType_S64});
  const std::string mismatch =
      "[execute] Failed to decode all FFI handler operands (bad operands at: "
      "1)\nDiagnostics:\nAttribute name mismatch: cod vs code";
  CHECK(ExplainDecodeError("t", "cpu", a.attrs, mismatch) ==
        "kreg: target \"t\" (cpu): the handler could not decode its "
        "operands. XLA FFI says: " +
            mismatch);
  CHECK(ExplainDecodeError("t", "cpu", a.attrs, "demo.Fail: refused") ==
        "demo.Fail: refused");
}

}  // namespace
}  // namespace shim
}  // namespace kreg
