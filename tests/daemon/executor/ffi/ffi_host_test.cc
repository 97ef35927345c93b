// FfiHost::Execute with genuine ffi.h handlers: buffers, every attribute
// kind, errors, asynchronous handlers, scratch memory, context values and
// concurrency.
#include "daemon/executor/ffi/ffi_host.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <complex>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "tests/daemon/executor/ffi/launch_builders.h"
#include "xla/ffi/api/ffi.h"

namespace kreg {
namespace {

namespace ffi = ::xla::ffi;
using testing::Array;
using testing::AsHandler;
using testing::Buffer;
using testing::Dict;
using testing::Scalar;
using testing::String;

//===--- Handlers ---------------------------------------------------------===//

ffi::Error ScaleImpl(ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> y,
                     float factor) {
  for (size_t i = 0; i < x.element_count(); ++i) {
    y->typed_data()[i] = x.typed_data()[i] * factor;
  }
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER(kScale, ScaleImpl,
                       ffi::Ffi::Bind()
                           .Arg<ffi::Buffer<ffi::F32>>()
                           .Ret<ffi::Buffer<ffi::F32>>()
                           .Attr<float>("factor"));

// sum = x + n; twice = 2 * n; both rank 2.
using F32x2 = ffi::Buffer<ffi::F32, 2>;
using S32x2 = ffi::Buffer<ffi::S32, 2>;
ffi::Error AddTwiceImpl(F32x2 x, S32x2 n, ffi::Result<F32x2> sum,
                        ffi::Result<S32x2> twice) {
  if (x.dimensions()[0] != 2 || x.dimensions()[1] != 3) {
    return ffi::Error::InvalidArgument("unexpected dims");
  }
  for (size_t i = 0; i < x.element_count(); ++i) {
    sum->typed_data()[i] = x.typed_data()[i] + n.typed_data()[i];
    twice->typed_data()[i] = 2 * n.typed_data()[i];
  }
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER(
    kAddTwice, AddTwiceImpl,
    ffi::Ffi::Bind().Arg<F32x2>().Arg<S32x2>().Ret<F32x2>().Ret<S32x2>());

// What kAttrs decoded, for the test to compare.
struct SeenAttrs {
  bool b;
  int8_t i8;
  int32_t i32;
  int64_t i64;
  uint16_t u16;
  float f32;
  double f64;
  std::complex<double> c128;
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> weights;
  size_t cfg_size;
  float alpha;
  std::string label;
  int32_t depth;
  std::vector<int32_t> ids;
} seen;

ffi::Error AttrsImpl(bool b, int8_t i8, int32_t i32, int64_t i64, uint16_t u16,
                     float f32, double f64, std::complex<double> c128,
                     std::string_view name, ffi::Span<const int64_t> shape,
                     ffi::Span<const float> weights, ffi::Dictionary cfg) {
  seen = SeenAttrs{};
  seen.b = b;
  seen.i8 = i8;
  seen.i32 = i32;
  seen.i64 = i64;
  seen.u16 = u16;
  seen.f32 = f32;
  seen.f64 = f64;
  seen.c128 = c128;
  seen.name = std::string(name);
  seen.shape.assign(shape.begin(), shape.end());
  seen.weights.assign(weights.begin(), weights.end());
  seen.cfg_size = cfg.size();
  ffi::ErrorOr<float> alpha = cfg.get<float>("alpha");
  ffi::ErrorOr<std::string_view> label = cfg.get<std::string_view>("label");
  ffi::ErrorOr<ffi::Dictionary> inner = cfg.get<ffi::Dictionary>("inner");
  ffi::ErrorOr<ffi::Span<const int32_t>> ids =
      cfg.get<ffi::Span<const int32_t>>("ids");
  if (alpha.has_error()) return alpha.error();
  if (label.has_error()) return label.error();
  if (inner.has_error()) return inner.error();
  if (ids.has_error()) return ids.error();
  ffi::ErrorOr<int32_t> depth = inner->get<int32_t>("depth");
  if (depth.has_error()) return depth.error();
  seen.alpha = *alpha;
  seen.label = std::string(*label);
  seen.depth = *depth;
  seen.ids.assign(ids->begin(), ids->end());
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER(kAttrs, AttrsImpl,
                       ffi::Ffi::Bind()
                           .Attr<bool>("b")
                           .Attr<int8_t>("i8")
                           .Attr<int32_t>("i32")
                           .Attr<int64_t>("i64")
                           .Attr<uint16_t>("u16")
                           .Attr<float>("f32")
                           .Attr<double>("f64")
                           .Attr<std::complex<double>>("c128")
                           .Attr<std::string_view>("name")
                           .Attr<ffi::Span<const int64_t>>("shape")
                           .Attr<ffi::Span<const float>>("weights")
                           .Attr<ffi::Dictionary>("cfg"));

ffi::Error FailImpl(ffi::Buffer<ffi::F32>) {
  return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                    "matrix is singular at pivot 3 (kernel's own words)");
}
XLA_FFI_DEFINE_HANDLER(kFail, FailImpl,
                       ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>());

// Completes its future from a pool task, late, with an error if `fail`.
ffi::Future AsyncScaleImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                           ffi::ResultBuffer<ffi::F32> y, float factor,
                           bool fail) {
  ffi::Promise promise;
  ffi::Future future(promise);
  const float* in = x.typed_data();
  float* out = y->typed_data();
  size_t n = x.element_count();
  pool.Schedule([promise, in, out, n, factor, fail]() mutable {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    if (fail) {
      promise.SetError(
          ffi::Error(ffi::ErrorCode::kDataLoss, "async: checksum mismatch"));
      return;
    }
    for (size_t i = 0; i < n; ++i) out[i] = in[i] * factor;
    promise.SetAvailable();
  });
  return future;
}
XLA_FFI_DEFINE_HANDLER(kAsyncScale, AsyncScaleImpl,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::ThreadPool>()
                           .Arg<ffi::Buffer<ffi::F32>>()
                           .Ret<ffi::Buffer<ffi::F32>>()
                           .Attr<float>("factor")
                           .Attr<bool>("fail"));

FfiHost* scratch_host = nullptr;  // the host kReverse reports on
int64_t scratch_seen_in_call = 0;

// Reverses x into y through 64-byte aligned scratch memory.
ffi::Error ReverseImpl(ffi::ScratchAllocator scratch, ffi::Buffer<ffi::F32> x,
                       ffi::ResultBuffer<ffi::F32> y) {
  size_t n = x.element_count();
  std::optional<void*> mem = scratch.Allocate(n * sizeof(float), 64);
  if (!mem.has_value()) return ffi::Error::Internal("allocation failed");
  if (reinterpret_cast<uintptr_t>(*mem) % 64 != 0) {
    return ffi::Error::Internal("scratch memory is not 64-byte aligned");
  }
  scratch_seen_in_call = scratch_host->scratch_bytes_in_use();
  auto* tmp = static_cast<float*>(*mem);
  for (size_t i = 0; i < n; ++i) tmp[i] = x.typed_data()[n - 1 - i];
  for (size_t i = 0; i < n; ++i) y->typed_data()[i] = tmp[i];
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER(kReverse, ReverseImpl,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::ScratchAllocator>()
                           .Arg<ffi::Buffer<ffi::F32>>()
                           .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_Error* Throwing(XLA_FFI_CallFrame*) {
  throw std::runtime_error("kernel threw: out of cheese");
}

LaunchFrame ScaleFrame(std::vector<float>& x, std::vector<float>& y,
                       float factor) {
  LaunchFrame frame;
  frame.args.push_back(Buffer(XLA_FFI_DataType_F32, x));
  frame.rets.push_back(Buffer(XLA_FFI_DataType_F32, y));
  frame.attrs.emplace_back("factor", Scalar(XLA_FFI_DataType_F32, factor));
  return frame;
}

//===--- Tests ------------------------------------------------------------===//

TEST_CASE("Execute runs an elementwise handler with a float attribute",
          "[ffi_host]") {
  FfiHost host;
  std::vector<float> x = {1, 2, 3, 4}, y(4, 0);
  REQUIRE(host.Execute(AsHandler(kScale), ScaleFrame(x, y, 2.5f)).ok());
  CHECK(y == std::vector<float>{2.5f, 5.0f, 7.5f, 10.0f});
}

TEST_CASE("Execute passes several args and rets with their dims",
          "[ffi_host]") {
  FfiHost host;
  std::vector<float> x = {1, 2, 3, 4, 5, 6}, sum(6);
  std::vector<int32_t> n = {10, 20, 30, 40, 50, 60}, twice(6);
  LaunchFrame frame;
  frame.args = {Buffer(XLA_FFI_DataType_F32, x),
                Buffer(XLA_FFI_DataType_S32, n)};
  frame.rets = {Buffer(XLA_FFI_DataType_F32, sum),
                Buffer(XLA_FFI_DataType_S32, twice)};
  for (auto* list : {&frame.args, &frame.rets}) {
    for (BufferRef& ref : *list) ref.dims = {2, 3};
  }
  absl::Status status = host.Execute(AsHandler(kAddTwice), frame);
  REQUIRE(status.ToString() == "OK");
  CHECK(sum == std::vector<float>{11, 22, 33, 44, 55, 66});
  CHECK(twice == std::vector<int32_t>{20, 40, 60, 80, 100, 120});
}

TEST_CASE("Execute passes every attribute kind, read back exactly",
          "[ffi_host]") {
  FfiHost host;
  LaunchFrame frame;
  // Sorted by name, as XLA passes them (and RingDecoder requires).
  frame.attrs = {
      {"b", Scalar<bool>(XLA_FFI_DataType_PRED, true)},
      {"c128", Scalar<std::complex<double>>(XLA_FFI_DataType_C128, {1.5, -2})},
      {"cfg",
       Dict({{"alpha", Scalar<float>(XLA_FFI_DataType_F32, 0.5f)},
             {"ids", Array<int32_t>(XLA_FFI_DataType_S32, {1, 2, 3})},
             {"inner",
              Dict({{"depth", Scalar<int32_t>(XLA_FFI_DataType_S32, 2)}})},
             {"label", String("x")}})},
      {"f32", Scalar<float>(XLA_FFI_DataType_F32, 0.1f)},
      {"f64", Scalar<double>(XLA_FFI_DataType_F64, 1.0 / 3.0)},
      {"i32", Scalar<int32_t>(XLA_FFI_DataType_S32, -123456)},
      {"i64", Scalar<int64_t>(XLA_FFI_DataType_S64, int64_t{1} << 40)},
      {"i8", Scalar<int8_t>(XLA_FFI_DataType_S8, -7)},
      {"name", String(std::string("gelu\0tanh", 9))},
      {"shape", Array<int64_t>(XLA_FFI_DataType_S64, {2, 3, 5})},
      {"u16", Scalar<uint16_t>(XLA_FFI_DataType_U16, 65535)},
      {"weights", Array<float>(XLA_FFI_DataType_F32, {0.25f, -1.5f, 3e9f})},
  };
  absl::Status status = host.Execute(AsHandler(kAttrs), frame);
  REQUIRE(status.ToString() == "OK");
  CHECK(seen.b == true);
  CHECK(seen.i8 == -7);
  CHECK(seen.i32 == -123456);
  CHECK(seen.i64 == (int64_t{1} << 40));
  CHECK(seen.u16 == 65535);
  CHECK(seen.f32 == 0.1f);
  CHECK(seen.f64 == 1.0 / 3.0);
  CHECK(seen.c128 == std::complex<double>(1.5, -2));
  CHECK(seen.name == std::string("gelu\0tanh", 9));
  CHECK(seen.shape == std::vector<int64_t>{2, 3, 5});
  CHECK(seen.weights == std::vector<float>{0.25f, -1.5f, 3e9f});
  CHECK(seen.cfg_size == 4);
  CHECK(seen.alpha == 0.5f);
  CHECK(seen.label == "x");
  CHECK(seen.depth == 2);
  CHECK(seen.ids == std::vector<int32_t>{1, 2, 3});
}

TEST_CASE("Execute refuses a null handler", "[ffi_host][errors]") {
  FfiHost host(FfiHostOptions{1});
  absl::Status status = host.Execute(nullptr, LaunchFrame{});
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(status.message() == "FfiHost::Execute: handler is null");
}

TEST_CASE("Execute returns a handler's error verbatim with its code",
          "[ffi_host][errors]") {
  FfiHost host;
  std::vector<float> x = {1};
  LaunchFrame frame;
  frame.args.push_back(Buffer(XLA_FFI_DataType_F32, x));
  absl::Status status = host.Execute(AsHandler(kFail), frame);
  CHECK(status.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(status.message() ==
        "matrix is singular at pivot 3 (kernel's own words)");
}

TEST_CASE("Execute turns an exception from a handler into UNKNOWN",
          "[ffi_host][errors]") {
  FfiHost host;
  absl::Status status = host.Execute(AsHandler(Throwing), LaunchFrame{});
  CHECK(status.code() == absl::StatusCode::kUnknown);
  CHECK(status.message() ==
        "XLA FFI handler threw an exception: kernel threw: out of cheese");
}

TEST_CASE("Execute waits for an async handler's future", "[ffi_host][async]") {
  FfiHost host(FfiHostOptions{2});
  std::vector<float> x = {1, 2, 3}, y(3, 0);
  LaunchFrame frame = ScaleFrame(x, y, 3.0f);
  frame.attrs.emplace_back("fail", Scalar<bool>(XLA_FFI_DataType_PRED, false));
  absl::Status status = host.Execute(AsHandler(kAsyncScale), frame);
  REQUIRE(status.ToString() == "OK");
  CHECK(y == std::vector<float>{3, 6, 9});  // written by the pool task
}

TEST_CASE("Execute returns the error an async handler's future completes with",
          "[ffi_host][async][errors]") {
  FfiHost host(FfiHostOptions{2});
  std::vector<float> x = {1}, y(1, 0);
  LaunchFrame frame = ScaleFrame(x, y, 3.0f);
  frame.attrs.emplace_back("fail", Scalar<bool>(XLA_FFI_DataType_PRED, true));
  absl::Status status = host.Execute(AsHandler(kAsyncScale), frame);
  CHECK(status.code() == absl::StatusCode::kDataLoss);
  CHECK(status.message() == "async: checksum mismatch");
}

TEST_CASE("ScratchAllocator gets aligned memory, freed after the call",
          "[ffi_host][scratch]") {
  FfiHost host;
  scratch_host = &host;
  std::vector<float> x = {1, 2, 3, 4, 5}, y(5, 0);
  LaunchFrame frame;
  frame.args.push_back(Buffer(XLA_FFI_DataType_F32, x));
  frame.rets.push_back(Buffer(XLA_FFI_DataType_F32, y));
  absl::Status status = host.Execute(AsHandler(kReverse), frame);
  REQUIRE(status.ToString() == "OK");
  CHECK(y == std::vector<float>{5, 4, 3, 2, 1});
  CHECK(scratch_seen_in_call == 5 * sizeof(float));
  CHECK(host.scratch_bytes_in_use() == 0);
}

TEST_CASE("ffi.h reports a wrong attribute count", "[ffi_host][errors]") {
  FfiHost host;
  std::vector<float> x = {1}, y(1);
  LaunchFrame frame = ScaleFrame(x, y, 1.0f);
  frame.attrs.emplace(frame.attrs.begin(), "extra",
                      Scalar<int32_t>(XLA_FFI_DataType_S32, 1));
  absl::Status status = host.Execute(AsHandler(kScale), frame);
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(status.message() ==
        "[execute] Wrong number of attributes: expected 1 but got 2 with "
        "name(s): extra, factor");
}

TEST_CASE("ffi.h reports a wrong dtype and a wrong argument count",
          "[ffi_host][errors]") {
  FfiHost host;
  std::vector<int32_t> xi = {1};
  std::vector<float> x = {1}, y(1);
  LaunchFrame frame = ScaleFrame(x, y, 1.0f);
  frame.args[0] = Buffer(XLA_FFI_DataType_S32, xi);
  absl::Status status = host.Execute(AsHandler(kScale), frame);
  CHECK_THAT(std::string(status.message()),
             Catch::Contains("Failed to decode all FFI handler operands (bad "
                             "operands at: 0)") &&
                 Catch::Contains("Wrong buffer dtype: expected F32 but got "
                                 "S32"));

  frame.args.push_back(frame.args[0]);
  status = host.Execute(AsHandler(kScale), frame);
  CHECK(status.message() ==
        "[execute] Wrong number of arguments: expected 1 but got 2");
}

TEST_CASE("ffi.h reports a call frame with a wrong struct size",
          "[ffi_host][errors]") {
  FfiHost host;
  XLA_FFI_CallFrame frame{};
  frame.struct_size = XLA_FFI_CallFrame_STRUCT_SIZE - 8;
  frame.api = HostedApi();
  absl::Status status = FfiHost::ErrorToStatus(HostedApi(), kScale(&frame));
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(status.message() ==
        "Unexpected XLA_FFI_CallFrame size: expected " +
            std::to_string(XLA_FFI_CallFrame_STRUCT_SIZE) + " got " +
            std::to_string(XLA_FFI_CallFrame_STRUCT_SIZE - 8) +
            ". Check installed software versions.");
}

TEST_CASE("Execute handles 8 threads of concurrent calls", "[ffi_host]") {
  FfiHost host(FfiHostOptions{4});
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&host, &failures, t] {
      for (int i = 0; i < 200; ++i) {
        std::vector<float> x(64, static_cast<float>(t)), y(64, -1);
        LaunchFrame frame = ScaleFrame(x, y, static_cast<float>(i));
        bool async = i % 10 == 0;
        if (async) {
          frame.attrs.emplace_back("fail",
                                   Scalar<bool>(XLA_FFI_DataType_PRED, false));
        }
        absl::Status status =
            host.Execute(AsHandler(async ? kAsyncScale : kScale), frame);
        if (!status.ok() || y[63] != static_cast<float>(t * i)) ++failures;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(failures.load() == 0);
  CHECK(host.scratch_bytes_in_use() == 0);
}

}  // namespace
}  // namespace kreg
