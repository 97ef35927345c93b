// LaunchFrames FfiHost cannot express as an XLA_FFI_CallFrame: each is
// refused with INVALID_ARGUMENT before any handler runs.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/executor/ffi/ffi_host.h"
#include "tests/daemon/executor/ffi/launch_builders.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace {

using testing::Array;
using testing::AsHandler;
using testing::Buffer;
using testing::Dict;
using testing::Scalar;
using testing::String;

XLA_FFI_Error* Nop(XLA_FFI_CallFrame*) { return nullptr; }

absl::Status RunNop(const LaunchFrame& frame) {
  FfiHost host(FfiHostOptions{1});
  return host.Execute(AsHandler(Nop), frame);
}

TEST_CASE("Execute refuses a null handler", "[call_frame][errors]") {
  FfiHost host(FfiHostOptions{1});
  absl::Status status = host.Execute(nullptr, LaunchFrame{});
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(status.message() == "FfiHost::Execute: handler is null");
}

TEST_CASE("Execute refuses duplicate attribute names", "[call_frame][errors]") {
  LaunchFrame frame;
  frame.attrs = {{"k", String("a")}, {"k", String("b")}};
  absl::Status status = RunNop(frame);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(status.message() == "attribute \"k\" appears twice");
}

TEST_CASE("Execute refuses a scalar whose bytes do not match its dtype",
          "[call_frame][errors]") {
  LaunchFrame frame;
  frame.attrs = {
      {"d", Dict({{"x", Scalar<int32_t>(XLA_FFI_DataType_S64, 1)}})}};
  CHECK(RunNop(frame).message() ==
        "scalar attribute \"d.x\" (dtype 5, 1 element(s)) has 4 bytes, "
        "expected 8");
}

TEST_CASE("Execute refuses an array whose count does not match its bytes",
          "[call_frame][errors]") {
  LaunchFrame frame;
  Attr arr = Array<int32_t>(XLA_FFI_DataType_S32, {1, 2, 3});
  arr.count = 4;
  frame.attrs = {{"a", arr}};
  CHECK(RunNop(frame).message() ==
        "array attribute \"a\" (dtype 4, 4 element(s)) has 12 bytes, "
        "expected 16");
  arr.count = -1;
  frame.attrs = {{"a", arr}};
  CHECK(RunNop(frame).message() ==
        "array attribute \"a\" has invalid element count -1");
}

TEST_CASE("Execute refuses an attribute dtype it cannot pass",
          "[call_frame][errors]") {
  LaunchFrame frame;
  frame.attrs = {{"t", Scalar<int8_t>(XLA_FFI_DataType_S4, 1)}};
  CHECK(RunNop(frame).message() ==
        "scalar attribute \"t\" has unsupported dtype 21");
}

TEST_CASE("Execute refuses dictionaries nested too deeply",
          "[call_frame][errors]") {
  Attr attr = String("leaf");
  for (int i = 0; i < 40; ++i) attr = Dict({{"d", attr}});
  LaunchFrame frame;
  frame.attrs = {{"root", attr}};
  CHECK_THAT(std::string(RunNop(frame).message()),
             Catch::StartsWith("attribute dictionaries are nested deeper "
                               "than 32 levels at \"root.d.d."));
}

TEST_CASE("Execute refuses buffers with an unknown dtype or negative dim",
          "[call_frame][errors]") {
  std::vector<float> x(4);
  LaunchFrame frame;
  frame.rets.push_back(Buffer(XLA_FFI_DataType_F32, x));
  frame.rets[0].dtype = 99;
  CHECK(RunNop(frame).message() == "ret 0 has unknown dtype 99");
  frame.rets[0].dtype = XLA_FFI_DataType_F32;
  frame.rets[0].dims = {2, -2};
  CHECK(RunNop(frame).message() == "ret 0 has negative dimension -2");
}

}  // namespace
}  // namespace kreg
