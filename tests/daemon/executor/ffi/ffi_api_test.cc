// kregd's XLA_FFI_Api functions called directly (raw handlers using the C
// API, and calls outside any handler), and LaunchFrames FfiHost refuses.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/executor/ffi/ffi_host.h"
#include "tests/daemon/executor/ffi/launch_builders.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace {

using testing::AsHandler;

XLA_FFI_Error* MakeError(const XLA_FFI_Api* api, XLA_FFI_Error_Code errc,
                         const char* message) {
  XLA_FFI_Error_Create_Args args{XLA_FFI_Error_Create_Args_STRUCT_SIZE, nullptr,
                                 message, errc};
  return api->XLA_FFI_Error_Create(&args);
}

XLA_FFI_Error* Allocate(XLA_FFI_CallFrame* f, size_t size, size_t alignment,
                        void** data) {
  XLA_FFI_DeviceMemory_Allocate_Args args{
      XLA_FFI_DeviceMemory_Allocate_Args_STRUCT_SIZE,
      nullptr,
      f->ctx,
      size,
      alignment,
      nullptr};
  XLA_FFI_Error* err = f->api->XLA_FFI_DeviceMemory_Allocate(&args);
  *data = args.data;
  return err;
}

XLA_FFI_Error* Free(XLA_FFI_CallFrame* f, void* data, size_t size) {
  XLA_FFI_DeviceMemory_Free_Args args{
      XLA_FFI_DeviceMemory_Free_Args_STRUCT_SIZE, nullptr, f->ctx, size, data};
  return f->api->XLA_FFI_DeviceMemory_Free(&args);
}

FfiHost* current_host = nullptr;
int64_t in_use_during_call = 0;

// Allocates three blocks, frees one, leaves two for FfiHost to free.
XLA_FFI_Error* LeakScratch(XLA_FFI_CallFrame* f) {
  void* a;
  void* b;
  void* c;
  if (auto* e = Allocate(f, 100, 16, &a)) return e;
  if (auto* e = Allocate(f, 200, 256, &b)) return e;
  if (auto* e = Allocate(f, 0, 1, &c)) return e;
  if (reinterpret_cast<uintptr_t>(b) % 256 != 0) {
    return MakeError(f->api, XLA_FFI_Error_Code_INTERNAL, "misaligned");
  }
  if (auto* e = Free(f, a, 100)) return e;
  in_use_during_call = current_host->scratch_bytes_in_use();
  return nullptr;
}

XLA_FFI_Error* FreeForeignPointer(XLA_FFI_CallFrame* f) {
  int on_stack = 0;
  return Free(f, &on_stack, sizeof(on_stack));
}

XLA_FFI_Error* AllocateBadAlignment(XLA_FFI_CallFrame* f) {
  void* data;
  return Allocate(f, 64, 3, &data);
}

const XLA_FFI_Extension* found_extension = nullptr;

XLA_FFI_Error* FindExtension42(XLA_FFI_CallFrame* f) {
  XLA_FFI_InvokeContext_FindExtension_Args args{
      XLA_FFI_InvokeContext_FindExtension_Args_STRUCT_SIZE, nullptr, f->ctx, 42,
      reinterpret_cast<const XLA_FFI_Extension*>(0x1)};
  XLA_FFI_Error* err = f->api->XLA_FFI_InvokeContext_FindExtension(&args);
  found_extension = args.extension;
  return err;
}

XLA_FFI_Error* RunIdWithSmallStruct(XLA_FFI_CallFrame* f) {
  XLA_FFI_RunId_Get_Args args{8, nullptr, f->ctx, 0};
  return f->api->XLA_FFI_RunId_Get(&args);
}

XLA_FFI_Error* RunIdWithoutContext(XLA_FFI_CallFrame* f) {
  XLA_FFI_RunId_Get_Args args{XLA_FFI_RunId_Get_Args_STRUCT_SIZE, nullptr,
                              nullptr, 0};
  return f->api->XLA_FFI_RunId_Get(&args);
}

XLA_FFI_Error* RegisterHandlerThroughApi(XLA_FFI_CallFrame* f) {
  XLA_FFI_Handler_Register_Args args{};
  args.struct_size = XLA_FFI_Handler_Register_Args_STRUCT_SIZE;
  args.name = XLA_FFI_ByteSpan{"my_op", 5};
  args.platform = XLA_FFI_ByteSpan{"cpu", 3};
  args.bundle.execute = RegisterHandlerThroughApi;
  return f->api->XLA_FFI_Handler_Register(&args);
}

XLA_FFI_Error* NumThreads(XLA_FFI_CallFrame* f) {
  int64_t n = 0;
  XLA_FFI_ThreadPool_NumThreads_Args args{
      XLA_FFI_ThreadPool_NumThreads_Args_STRUCT_SIZE, nullptr, f->ctx, &n};
  return f->api->XLA_FFI_ThreadPool_NumThreads(&args);
}

XLA_FFI_Future* NewFuture(const XLA_FFI_Api* api) {
  XLA_FFI_Future_Create_Args args{XLA_FFI_Future_Create_Args_STRUCT_SIZE,
                                  nullptr, nullptr};
  if (XLA_FFI_Error* err = api->XLA_FFI_Future_Create(&args)) {
    FfiHost::ErrorToStatus(api, err).IgnoreError();
    return nullptr;
  }
  return args.future;
}

absl::Status completed_twice;

// Completes its future, then tries again.
XLA_FFI_Error* CompleteTwice(XLA_FFI_CallFrame* f) {
  XLA_FFI_Future* future = NewFuture(f->api);
  XLA_FFI_Future_SetAvailable_Args args{
      XLA_FFI_Future_SetAvailable_Args_STRUCT_SIZE, nullptr, future};
  if (auto* e = f->api->XLA_FFI_Future_SetAvailable(&args)) return e;
  completed_twice = FfiHost::ErrorToStatus(
      f->api, f->api->XLA_FFI_Future_SetAvailable(&args));
  f->future = future;
  return nullptr;
}

// Completes its future with a null error.
XLA_FFI_Error* SetNullError(XLA_FFI_CallFrame* f) {
  XLA_FFI_Future* future = NewFuture(f->api);
  XLA_FFI_Future_SetError_Args args{XLA_FFI_Future_SetError_Args_STRUCT_SIZE,
                                    nullptr, future, nullptr};
  if (auto* e = f->api->XLA_FFI_Future_SetError(&args)) return e;
  f->future = future;
  return nullptr;
}

// Records the CUDA allocator traffic of a call.
class FakeDeviceAllocator : public DeviceAllocator {
 public:
  absl::StatusOr<void*> Allocate(size_t size, size_t alignment) override {
    ++allocations;
    void* data = nullptr;
    if (posix_memalign(&data, std::max(alignment, sizeof(void*)), size + 1)) {
      return absl::ResourceExhaustedError("fake allocator");
    }
    return data;
  }
  absl::Status Free(void* data, size_t size) override {
    ++frees;
    std::free(data);
    return absl::OkStatus();
  }
  int allocations = 0;
  int frees = 0;
};

//===--- Tests ------------------------------------------------------------===//

TEST_CASE("The API table has this build's sizes and version", "[ffi_api]") {
  FfiHost host;
  const XLA_FFI_Api* api = HostedApi();
  CHECK(api == HostedApi());
  CHECK(api->struct_size == XLA_FFI_Api_STRUCT_SIZE);
  CHECK(api->api_version.struct_size == XLA_FFI_Api_Version_STRUCT_SIZE);
  CHECK(api->api_version.major_version == kHostedApiMajor);
  CHECK(api->api_version.minor_version == kHostedApiMinor);
  CHECK(kHostedApiMajor == 0);
  CHECK(kHostedApiMinor == 4);
}

TEST_CASE("Errors round-trip and every code maps to absl's", "[ffi_api]") {
  const XLA_FFI_Api* api = HostedApi();
  for (int code = 1; code <= 16; ++code) {
    absl::Status status = FfiHost::ErrorToStatus(
        api, MakeError(api, static_cast<XLA_FFI_Error_Code>(code), "m s g"));
    CHECK(static_cast<int>(status.code()) == code);
    CHECK(status.message() == "m s g");
  }
  absl::Status unknown = FfiHost::ErrorToStatus(
      api, MakeError(api, static_cast<XLA_FFI_Error_Code>(31), "odd code"));
  CHECK(unknown.code() == absl::StatusCode::kUnknown);
  CHECK(unknown.message() == "odd code");
  CHECK(FfiHost::ErrorToStatus(api, nullptr).ok());

  XLA_FFI_Error_Create_Args small{8, nullptr, "x", XLA_FFI_Error_Code_INTERNAL};
  absl::Status refused =
      FfiHost::ErrorToStatus(api, api->XLA_FFI_Error_Create(&small));
  CHECK(refused.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(refused.message()),
             Catch::StartsWith("XLA_FFI_Error_Create: args struct_size is 8, "
                               "expected at least"));
}

TEST_CASE("Type_Register assigns unique ids, idempotent per name",
          "[ffi_api]") {
  const XLA_FFI_Api* api = HostedApi();
  auto reg = [api](const char* name, int64_t id, int64_t* out) {
    XLA_FFI_TypeId type_id{id};
    XLA_FFI_Type_Register_Args args{
        XLA_FFI_Type_Register_Args_STRUCT_SIZE, nullptr,
        XLA_FFI_ByteSpan{name, strlen(name)}, &type_id, nullptr};
    absl::Status status =
        FfiHost::ErrorToStatus(api, api->XLA_FFI_Type_Register(&args));
    *out = type_id.type_id;
    return status;
  };
  int64_t a, a_again, b, unused;
  REQUIRE(reg("kreg.test.TypeA", 0, &a).ok());
  REQUIRE(reg("kreg.test.TypeA", 0, &a_again).ok());
  REQUIRE(reg("kreg.test.TypeB", 0, &b).ok());
  CHECK(a > 0);
  CHECK(a == a_again);
  CHECK(b != a);
  CHECK(reg("kreg.test.TypeA", a, &unused).ok());

  absl::Status conflict = reg("kreg.test.TypeA", b, &unused);
  CHECK(conflict.code() == absl::StatusCode::kAlreadyExists);
  CHECK(conflict.message() ==
        "XLA_FFI_Type_Register: type \"kreg.test.TypeA\" is already "
        "registered with type id " +
            std::to_string(a) + ", not " + std::to_string(b));

  absl::Status taken = reg("kreg.test.TypeC", a, &unused);
  CHECK(taken.message() == "XLA_FFI_Type_Register: type id " +
                               std::to_string(a) +
                               " requested for type \"kreg.test.TypeC\" "
                               "already belongs to type \"kreg.test.TypeA\"");

  absl::Status empty = reg("", 0, &unused);
  CHECK(empty.code() == absl::StatusCode::kInvalidArgument);
  CHECK(empty.message() == "XLA_FFI_Type_Register: type name is empty");
}

TEST_CASE("Handler_Register is refused: handlers are registered with kregd",
          "[ffi_api][errors]") {
  FfiHost host;
  absl::Status status =
      host.Execute(AsHandler(RegisterHandlerThroughApi), LaunchFrame{});
  CHECK(status.code() == absl::StatusCode::kUnimplemented);
  CHECK_THAT(std::string(status.message()),
             Catch::StartsWith("XLA_FFI_Handler_Register: kregd does not "
                               "register handlers through the XLA FFI API "
                               "(handler \"my_op\" ignored)"));
}

TEST_CASE("Scratch memory a handler leaves is freed after the call",
          "[ffi_api][scratch]") {
  FfiHost host;
  current_host = &host;
  REQUIRE(host.Execute(AsHandler(LeakScratch), LaunchFrame{}).ok());
  CHECK(in_use_during_call == 200);
  CHECK(host.scratch_bytes_in_use() == 0);
}

TEST_CASE("DeviceMemory_Free of a foreign pointer is refused",
          "[ffi_api][scratch][errors]") {
  FfiHost host;
  absl::Status status =
      host.Execute(AsHandler(FreeForeignPointer), LaunchFrame{});
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(status.message()),
             Catch::StartsWith("XLA_FFI_DeviceMemory_Free: 0x") &&
                 Catch::EndsWith(" was not allocated by "
                                 "XLA_FFI_DeviceMemory_Allocate in this "
                                 "call, or was freed already"));
}

TEST_CASE(
    "DeviceMemory_Allocate refuses an alignment that is not a power "
    "of two",
    "[ffi_api][scratch][errors]") {
  FfiHost host;
  absl::Status status =
      host.Execute(AsHandler(AllocateBadAlignment), LaunchFrame{});
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(status.message() ==
        "XLA_FFI_DeviceMemory_Allocate: alignment 3 is not a power of two");
}

TEST_CASE("CUDA scratch memory goes through the executor's allocator",
          "[ffi_api][scratch]") {
  FfiHost host;
  current_host = &host;
  FakeDeviceAllocator allocator;
  LaunchFrame frame;
  frame.platform = Platform::kCuda;
  CallOptions options;
  options.device_allocator = &allocator;
  REQUIRE(host.Execute(AsHandler(LeakScratch), frame, options).ok());
  CHECK(allocator.allocations == 3);
  CHECK(allocator.frees == 3);  // one by the handler, two after the call
  CHECK(host.scratch_bytes_in_use() == 0);

  absl::Status status = host.Execute(AsHandler(LeakScratch), frame);
  CHECK(status.code() == absl::StatusCode::kUnimplemented);
  CHECK(status.message() ==
        "XLA_FFI_DeviceMemory_Allocate: no device memory allocator is "
        "available for this call");
}

TEST_CASE("ThreadPool is refused on CUDA", "[ffi_api][errors]") {
  FfiHost host;
  LaunchFrame frame;
  frame.platform = Platform::kCuda;
  absl::Status status = host.Execute(AsHandler(NumThreads), frame);
  CHECK(status.code() == absl::StatusCode::kUnimplemented);
  CHECK(status.message() ==
        "XLA_FFI_ThreadPool_NumThreads: no thread pool on the cuda platform "
        "(as in XLA:GPU)");
  CHECK(host.Execute(AsHandler(NumThreads), LaunchFrame{}).ok());
}

TEST_CASE("FindExtension reports not-found as null, finds a given extension",
          "[ffi_api]") {
  FfiHost host;
  REQUIRE(host.Execute(AsHandler(FindExtension42), LaunchFrame{}).ok());
  CHECK(found_extension == nullptr);

  XLA_FFI_Extension other{XLA_FFI_Extension_STRUCT_SIZE, {7, 1, 0}, nullptr};
  XLA_FFI_Extension wanted{XLA_FFI_Extension_STRUCT_SIZE, {42, 1, 0}, &other};
  CallOptions options;
  options.extensions = &wanted;
  REQUIRE(
      host.Execute(AsHandler(FindExtension42), LaunchFrame{}, options).ok());
  CHECK(found_extension == &wanted);
}

TEST_CASE("An args struct smaller than this build's is refused",
          "[ffi_api][errors]") {
  FfiHost host;
  absl::Status status =
      host.Execute(AsHandler(RunIdWithSmallStruct), LaunchFrame{});
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(status.message() ==
        "XLA_FFI_RunId_Get: args struct_size is 8, expected at least " +
            std::to_string(XLA_FFI_RunId_Get_Args_STRUCT_SIZE) +
            " (kregd hosts XLA FFI API 0.4); check installed software "
            "versions");
}

TEST_CASE("A null execution context is refused", "[ffi_api][errors]") {
  FfiHost host;
  absl::Status status =
      host.Execute(AsHandler(RunIdWithoutContext), LaunchFrame{});
  CHECK(status.message() ==
        "XLA_FFI_RunId_Get: no execution context (ctx is null)");
}

TEST_CASE("Completing a future twice is refused", "[ffi_api][async][errors]") {
  FfiHost host;
  REQUIRE(host.Execute(AsHandler(CompleteTwice), LaunchFrame{}).ok());
  CHECK(completed_twice.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(completed_twice.message() ==
        "XLA_FFI_Future_SetAvailable: the future is already completed");
}

TEST_CASE("A future completed with a null error still ends the call",
          "[ffi_api][async][errors]") {
  FfiHost host;
  absl::Status status = host.Execute(AsHandler(SetNullError), LaunchFrame{});
  CHECK(status.code() == absl::StatusCode::kInternal);
  CHECK(status.message() ==
        "XLA_FFI_Future_SetError: the handler completed its future with a "
        "null or OK error");
}

}  // namespace
}  // namespace kreg
