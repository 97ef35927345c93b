// XLA's handler metadata call (QueryHandlerMetadata) and the API version
// check built on it.
#include <catch2/catch.hpp>
#include <string>

#include "absl/status/status.h"
#include "daemon/executor/ffi/ffi_host.h"
#include "tests/daemon/executor/ffi/launch_builders.h"
#include "xla/ffi/api/ffi.h"

namespace kreg {
namespace {

namespace ffi = ::xla::ffi;
using testing::AsHandler;

ffi::Error PlainImpl(ffi::Buffer<ffi::F32>, ffi::ResultBuffer<ffi::F32>) {
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER(
    kPlain, PlainImpl,
    ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER(
    kCmdBuffer, PlainImpl,
    ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>(),
    {ffi::Traits::kCmdBufferCompatible});

// Returns OK without looking at the frame: not a handler.
XLA_FFI_Error* NotAHandler(XLA_FFI_CallFrame*) { return nullptr; }

// Refuses every call, the metadata call included.
XLA_FFI_Error* Refuses(XLA_FFI_CallFrame* frame) {
  XLA_FFI_Error_Create_Args args{XLA_FFI_Error_Create_Args_STRUCT_SIZE, nullptr,
                                 "I only run on Tuesdays",
                                 XLA_FFI_Error_Code_UNAVAILABLE};
  return frame->api->XLA_FFI_Error_Create(&args);
}

TEST_CASE("QueryHandlerMetadata reads a real handler's version and traits",
          "[metadata]") {
  absl::StatusOr<HandlerInfo> info = QueryHandlerMetadata(AsHandler(kPlain));
  REQUIRE(info.status().ToString() == "OK");
  CHECK(info->api_major == 0);
  CHECK(info->api_minor == 4);
  CHECK(info->traits == 0);
  CHECK(info->state_type_id == 0);

  absl::StatusOr<HandlerInfo> cmd = QueryHandlerMetadata(AsHandler(kCmdBuffer));
  REQUIRE(cmd.ok());
  CHECK(cmd->traits == XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE);
}

TEST_CASE("QueryHandlerMetadata rejects a function that does not answer",
          "[metadata][errors]") {
  absl::StatusOr<HandlerInfo> info =
      QueryHandlerMetadata(AsHandler(NotAHandler), "my_func");
  CHECK(info.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(info.status().message() ==
        "symbol \"my_func\" does not answer XLA FFI's metadata call; it is "
        "not an XLA FFI handler");
}

TEST_CASE("QueryHandlerMetadata reports a handler's error",
          "[metadata][errors]") {
  absl::StatusOr<HandlerInfo> info =
      QueryHandlerMetadata(AsHandler(Refuses), "tuesday_op");
  CHECK(info.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(info.status().message() ==
        "symbol \"tuesday_op\" failed XLA FFI's metadata call: I only run on "
        "Tuesdays");
}

TEST_CASE("QueryHandlerMetadata rejects a null symbol", "[metadata][errors]") {
  absl::StatusOr<HandlerInfo> info = QueryHandlerMetadata(nullptr);
  CHECK(info.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(info.status().message() == "symbol is null");
}

}  // namespace
}  // namespace kreg
