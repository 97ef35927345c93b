// What a handler reaches through its execution context: run id, device
// ordinal, thread pool, platform stream, and the clear errors for user data
// (which kregd does not support: a clear error), and a call site's state
// (State_Set at the instantiate stage, State_Get after it).
#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
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
  static int live;
  int64_t value = 0;
  UserThing() { ++live; }
  ~UserThing() { --live; }
};
int UserThing::live = 0;
ffi::TypeId UserThing::id = {};
XLA_FFI_REGISTER_TYPE(HostedApi(), "kreg.test.UserThing", &UserThing::id,
                      ffi::MakeTypeInfo<UserThing>());

ffi::Error UserDataImpl(UserThing*) { return ffi::Error::Success(); }
XLA_FFI_DEFINE_HANDLER(kUserData, UserDataImpl,
                       ffi::Ffi::Bind().Ctx<ffi::UserData<UserThing>>());

ffi::Error StateImpl(UserThing* thing, ffi::ResultBuffer<ffi::S64> out) {
  out->typed_data()[0] = ++thing->value;
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER(
    kState, StateImpl,
    ffi::Ffi::Bind().Ctx<ffi::State<UserThing>>().Ret<ffi::Buffer<ffi::S64>>());

ffi::ErrorOr<std::unique_ptr<UserThing>> MakeThing(int64_t start) {
  auto thing = std::make_unique<UserThing>();
  thing->value = start;
  return thing;
}
XLA_FFI_DEFINE_HANDLER(kMakeThing, MakeThing,
                       ffi::Ffi::BindInstantiate().Attr<int64_t>("start"));

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

ffi::Error PrepareStreamImpl(void* /*stream*/) { return ffi::Error::Success(); }
XLA_FFI_DEFINE_HANDLER(
    kPrepareStream, PrepareStreamImpl,
    ffi::Ffi::BindPrepare().Ctx<ffi::PlatformStream<void*>>());

ffi::Error ReadPreparedImpl(UserThing* /*thing*/) {
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER(
    kReadPrepared, ReadPreparedImpl,
    ffi::Ffi::BindInitialize().Ctx<ffi::Prepared<UserThing>>());

TEST_CASE(
    "A prepare or initialize stage run by kregd has no stream and no "
    "per-execution state, and says so",
    "[ffi_host][errors]") {
  FfiHost host;
  LaunchFrame frame;
  frame.platform = Platform::kCuda;
  CallOptions options;
  options.stage = XLA_FFI_ExecutionStage_PREPARE;
  absl::Status status = host.Execute(AsHandler(kPrepareStream), frame, options);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(status.message()),
             Catch::Contains("XLA_FFI_Stream_Get: kregd's isolated mode runs "
                             "a bundle's prepare stage without a stream") &&
                 Catch::Contains("execution=\"local\""));
  options.stage = XLA_FFI_ExecutionStage_INITIALIZE;
  status = host.Execute(AsHandler(kReadPrepared), frame, options);
  CHECK_THAT(std::string(status.message()),
             Catch::Contains("XLA_FFI_State_Get: per-execution states (the "
                             "prepare stage's, ffi::Prepared<T>) are not kept "
                             "by kregd's isolated mode"));
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

TEST_CASE("A state set at instantiate reaches the execute stage",
          "[ffi_host]") {
  FfiHost host;
  LaunchFrame init;
  Attr start;
  start.dtype = XLA_FFI_DataType_S64;
  int64_t v = 40;
  start.bytes.assign(reinterpret_cast<const char*>(&v), sizeof(v));
  init.attrs.emplace_back("start", start);
  HostedState state;
  CallOptions instantiate;
  instantiate.stage = XLA_FFI_ExecutionStage_INSTANTIATE;
  instantiate.state_out = &state;
  REQUIRE(host.Execute(AsHandler(kMakeThing), init, instantiate).ok());
  REQUIRE(state.ptr != nullptr);
  CHECK(state.type_id == UserThing::id.type_id);
  CHECK(UserThing::live == 1);

  std::vector<int64_t> out(1, -1);
  LaunchFrame frame;
  frame.rets.push_back(Buffer(XLA_FFI_DataType_S64, out));
  CallOptions execute;
  execute.state = state;
  REQUIRE(host.Execute(AsHandler(kState), frame, execute).ok());
  REQUIRE(host.Execute(AsHandler(kState), frame, execute).ok());
  CHECK(out[0] == 42);
  CHECK(DestroyState(state));
  CHECK(UserThing::live == 0);
}

TEST_CASE("State_Get without a state and State_Set outside instantiate fail",
          "[ffi_host][errors]") {
  FfiHost host;
  std::vector<int64_t> out(1, -1);
  LaunchFrame frame;
  frame.rets.push_back(Buffer(XLA_FFI_DataType_S64, out));
  absl::Status status = host.Execute(AsHandler(kState), frame);
  CHECK_THAT(std::string(status.message()),
             Catch::Contains("XLA_FFI_State_Get: this call site has no "
                             "state: register the target as a handler "
                             "bundle with an instantiate stage"));
  HostedState other{&out, UserThing::id.type_id + 1000};
  CallOptions wrong;
  wrong.state = other;
  status = host.Execute(AsHandler(kState), frame, wrong);
  CHECK_THAT(std::string(status.message()),
             Catch::Contains("XLA_FFI_State_Get: the state has type id"));

  LaunchFrame init;
  Attr start;
  start.dtype = XLA_FFI_DataType_S64;
  start.bytes.assign(8, '\0');
  init.attrs.emplace_back("start", start);
  // An instantiate call with nowhere to keep its state: the state it made
  // is destroyed and the call fails.
  CallOptions nowhere;
  nowhere.stage = XLA_FFI_ExecutionStage_INSTANTIATE;
  status = host.Execute(AsHandler(kMakeThing), init, nowhere);
  CHECK_THAT(std::string(status.message()),
             Catch::Contains("XLA_FFI_State_Set: this call keeps no state"));
  CHECK(UserThing::live == 0);
}

}  // namespace
}  // namespace kreg
