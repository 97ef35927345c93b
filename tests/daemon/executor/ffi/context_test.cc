// What a handler reaches through its execution context: run id, device
// ordinal, thread pool, platform stream, and the clear errors for user data
// and state, which kregd does not support.
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/executor/ffi/ffi_host.h"
#include "tests/daemon/executor/ffi/launch_builders.h"
#include "xla/ffi/api/ffi.h"

namespace kreg {
namespace {

namespace ffi = ::xla::ffi;
using testing::AsHandler;
using testing::Buffer;

ffi::Error StreamImpl(void* stream, ffi::ResultBuffer<ffi::S64> out) {
  out->typed_data()[0] = reinterpret_cast<int64_t>(stream);
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER(kStream, StreamImpl,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::PlatformStream<void*>>()
                           .Ret<ffi::Buffer<ffi::S64>>());

ffi::Error ContextImpl(ffi::RunId run_id, int32_t device_ordinal,
                       ffi::ThreadPool pool, ffi::ResultBuffer<ffi::S64> out) {
  out->typed_data()[0] = run_id.run_id;
  out->typed_data()[1] = device_ordinal;
  out->typed_data()[2] = pool.num_threads();
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER(kContext, ContextImpl,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::RunId>()
                           .Ctx<ffi::DeviceOrdinal>()
                           .Ctx<ffi::ThreadPool>()
                           .Ret<ffi::Buffer<ffi::S64>>());

struct UserThing {
  static ffi::TypeId id;
};
ffi::TypeId UserThing::id = {};
XLA_FFI_REGISTER_TYPE(HostedApi(), "kreg.test.UserThing", &UserThing::id,
                      ffi::MakeTypeInfo<UserThing>());

ffi::Error UserDataImpl(UserThing*) { return ffi::Error::Success(); }
XLA_FFI_DEFINE_HANDLER(kUserData, UserDataImpl,
                       ffi::Ffi::Bind().Ctx<ffi::UserData<UserThing>>());

ffi::Error StateImpl(UserThing*) { return ffi::Error::Success(); }
XLA_FFI_DEFINE_HANDLER(kState, StateImpl,
                       ffi::Ffi::Bind().Ctx<ffi::State<UserThing>>());

TEST_CASE("Context values reach the handler", "[ffi_host]") {
  FfiHost host(FfiHostOptions{3});
  std::vector<int64_t> out(3, -1);
  LaunchFrame frame;
  frame.rets.push_back(Buffer(XLA_FFI_DataType_S64, out));
  frame.run_id = 987654321;
  frame.device_ordinal = 5;
  REQUIRE(host.Execute(AsHandler(kContext), frame).ok());
  CHECK(out == std::vector<int64_t>{987654321, 5, 3});
  CHECK(host.num_threads() == 3);
}

TEST_CASE("Stream_Get on CPU fails with a clear error", "[ffi_host][errors]") {
  FfiHost host;
  std::vector<int64_t> out(1, 0);
  LaunchFrame frame;
  frame.rets.push_back(Buffer(XLA_FFI_DataType_S64, out));
  absl::Status status = host.Execute(AsHandler(kStream), frame);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(status.message()),
             Catch::Contains("Failed to get platform stream: "
                             "XLA_FFI_Stream_Get: streams are a GPU concept; "
                             "this call runs on the cpu platform, which has "
                             "no stream (as in XLA:CPU)"));
}

TEST_CASE("Stream_Get on CUDA returns the executor's stream", "[ffi_host]") {
  FfiHost host;
  std::vector<int64_t> out(1, 0);
  LaunchFrame frame;
  frame.platform = Platform::kCuda;
  frame.rets.push_back(Buffer(XLA_FFI_DataType_S64, out));
  CallOptions options;
  options.stream = reinterpret_cast<void*>(0x5eed);
  REQUIRE(host.Execute(AsHandler(kStream), frame, options).ok());
  CHECK(out[0] == 0x5eed);

  absl::Status status = host.Execute(AsHandler(kStream), frame);
  CHECK_THAT(std::string(status.message()),
             Catch::Contains("XLA_FFI_Stream_Get: no stream is available for "
                             "this call"));
}

TEST_CASE("UserData is refused with a clear error", "[ffi_host][errors]") {
  FfiHost host;
  CHECK(UserThing::id.type_id > 0);
  absl::Status status = host.Execute(AsHandler(kUserData), LaunchFrame{});
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(status.message()),
             Catch::Contains("Failed to get user data from execution context: "
                             "XLA_FFI_InvokeContext_Get: execution-context "
                             "user data (type id"));
}

TEST_CASE("State is refused with a clear error", "[ffi_host][errors]") {
  FfiHost host;
  absl::Status status = host.Execute(AsHandler(kState), LaunchFrame{});
  CHECK_THAT(std::string(status.message()),
             Catch::Contains("XLA_FFI_State_Get: state is not supported by "
                             "kregd yet"));
}

}  // namespace
}  // namespace kreg
