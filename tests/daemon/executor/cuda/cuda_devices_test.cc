// CudaDevices over a fake driver: start-up without driver or device, UUID
// matching, sticky errors, context scopes.
#include "daemon/executor/cuda/cuda_devices.h"

#include <string>

#include "catch2/catch.hpp"
#include "tests/testing/fake_cuda.h"

namespace kreg {
namespace {

using testing::FakeCuda;

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_CASE("Without a driver there are no devices and the reason is kept",
          "[cuda_devices]") {
  auto devices = CudaDevices::Open(
      nullptr, "no CUDA driver: dlopen(\"libcuda.so.1\") failed: not found");
  CHECK(devices->count() == 0);
  CHECK(devices->status().code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(devices->status().message()) ==
        "no CUDA driver: dlopen(\"libcuda.so.1\") failed: not found; kregd "
        "serves CPU targets only");
  absl::StatusOr<int> found = devices->FindByUuid(FakeCuda::Uuid(1));
  CHECK(found.status() == devices->status());
  CHECK(devices->CheckUsable(0) == devices->status());
}

TEST_CASE("cuInit failing means no CUDA device", "[cuda_devices]") {
  FakeCuda fake;
  fake.init_result = cu::CUDA_ERROR_NO_DEVICE;
  auto devices = CudaDevices::Open(fake.driver(), "");
  CHECK(devices->count() == 0);
  CHECK(devices->status().code() == absl::StatusCode::kUnavailable);
  CHECK(Contains(std::string(devices->status().message()),
                 "no CUDA device: cuInit failed: CUDA_ERROR_NO_DEVICE (100): "
                 "no CUDA-capable device is detected"));
}

TEST_CASE("A driver with zero devices means no CUDA device", "[cuda_devices]") {
  FakeCuda fake;
  fake.devices.clear();
  auto devices = CudaDevices::Open(fake.driver(), "");
  CHECK(devices->status().code() == absl::StatusCode::kUnavailable);
  CHECK(Contains(std::string(devices->status().message()),
                 "the driver reports 0 devices"));
}

TEST_CASE("Primary contexts are retained at start and released at the end",
          "[cuda_devices]") {
  FakeCuda fake;
  fake.devices.push_back(FakeCuda::Device{FakeCuda::Uuid(0xb1), "Fake B"});
  {
    auto devices = CudaDevices::Open(fake.driver(), "");
    REQUIRE(devices->status().ok());
    CHECK(devices->count() == 2);
    CHECK(fake.retained_contexts == 2);
    CHECK(devices->info(1).name == "Fake B");
    CHECK(devices->info(1).cc_major == 9);
    CHECK(devices->info(0).uuid_text ==
          "GPU-a0a0a0a0-a0a0-a0a0-a0a0-a0a0a0a0a0a0");
  }
  CHECK(fake.retained_contexts == 0);
}

TEST_CASE("Devices are found by UUID", "[cuda_devices]") {
  FakeCuda fake;
  fake.devices.push_back(FakeCuda::Device{FakeCuda::Uuid(0xb1), "Fake B"});
  auto devices = CudaDevices::Open(fake.driver(), "");
  CHECK(*devices->FindByUuid(FakeCuda::Uuid(0xa0)) == 0);
  CHECK(*devices->FindByUuid(FakeCuda::Uuid(0xb1)) == 1);
}

TEST_CASE("An unknown UUID is NOT_FOUND and lists kregd's devices",
          "[cuda_devices]") {
  FakeCuda fake;
  fake.devices.push_back(FakeCuda::Device{FakeCuda::Uuid(0xb1), "Fake B"});
  auto devices = CudaDevices::Open(fake.driver(), "");
  absl::StatusOr<int> found = devices->FindByUuid(FakeCuda::Uuid(0x33));
  REQUIRE(found.status().code() == absl::StatusCode::kNotFound);
  const std::string msg(found.status().message());
  CHECK(Contains(msg,
                 "CUDA device GPU-33333333-3333-3333-3333-333333333333 is not "
                 "visible to kregd"));
  CHECK(Contains(msg,
                 "kregd's devices: GPU-a0a0a0a0-a0a0-a0a0-a0a0-a0a0a0a0a0a0 "
                 "(ordinal 0, Fake H200, sm_90), "
                 "GPU-b1b1b1b1-b1b1-b1b1-b1b1-b1b1b1b1b1b1 (ordinal 1, Fake B, "
                 "sm_90)"));
}

TEST_CASE("A UUID that is not 16 bytes is INVALID_ARGUMENT", "[cuda_devices]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  CHECK(devices->FindByUuid("GPU-a0a0").status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("A device whose context cannot be retained is unusable, others work",
          "[cuda_devices]") {
  FakeCuda fake;
  fake.devices.push_back(FakeCuda::Device{FakeCuda::Uuid(0xb1), "Fake B"});
  fake.FailNext("cuDevicePrimaryCtxRetain", cu::CUDA_ERROR_OUT_OF_MEMORY);
  auto devices = CudaDevices::Open(fake.driver(), "");
  CHECK(devices->status().ok());
  CHECK(devices->CheckUsable(0).code() == absl::StatusCode::kInternal);
  CHECK(Contains(std::string(devices->CheckUsable(0).message()),
                 "retaining the primary context"));
  CHECK(devices->CheckUsable(1).ok());
  CHECK(fake.retained_contexts == 1);
}

TEST_CASE("An ordinal out of range is INVALID_ARGUMENT", "[cuda_devices]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  CHECK(devices->CheckUsable(1).code() == absl::StatusCode::kInvalidArgument);
  CHECK(devices->CheckUsable(-1).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("A sticky error marks the device broken for good", "[cuda_devices]") {
  FakeCuda fake;
  fake.devices.push_back(FakeCuda::Device{FakeCuda::Uuid(0xb1), "Fake B"});
  auto devices = CudaDevices::Open(fake.driver(), "");
  absl::Status s =
      devices->Check(0, cu::CUDA_ERROR_ILLEGAL_ADDRESS, "a handler's kernel");
  CHECK(s.code() == absl::StatusCode::kInternal);
  const std::string msg(s.message());
  CHECK(Contains(msg,
                 "CUDA device GPU-a0a0a0a0-a0a0-a0a0-a0a0-a0a0a0a0a0a0 "
                 "(kregd ordinal 0) hit a sticky error in a handler's "
                 "kernel: CUDA_ERROR_ILLEGAL_ADDRESS (700)"));
  CHECK(Contains(msg, "restart kregd"));
  CHECK(devices->CheckUsable(0) == s);
  CHECK(devices->Context(0).status() == s);
  // A later, different sticky error does not replace the first.
  CHECK(devices->Check(0, cu::CUDA_ERROR_LAUNCH_FAILED, "later") == s);
  CHECK(devices->CheckUsable(1).ok());
}

TEST_CASE(
    "Ordinary CUDA errors map to status codes and do not break the "
    "device",
    "[cuda_devices]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  CHECK(devices->Check(0, cu::CUDA_ERROR_OUT_OF_MEMORY, "x").code() ==
        absl::StatusCode::kResourceExhausted);
  CHECK(devices->Check(0, cu::CUDA_ERROR_INVALID_VALUE, "x").code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(devices->Check(0, cu::CUDA_ERROR_NOT_SUPPORTED, "x").code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(
            devices->Check(0, cu::CUDA_ERROR_OUT_OF_MEMORY, "cuMemAllocAsync")
                .message()) ==
        "cuMemAllocAsync: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory");
  CHECK(devices->CheckUsable(0).ok());
}

TEST_CASE("The stream probe accepts pending work and catches sticky errors",
          "[cuda_devices]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  auto stream = reinterpret_cast<cu::CUstream>(0x2001);
  fake.EnqueueKernel();  // not complete: NOT_READY
  CHECK(devices->CheckStream(0, stream).ok());
  fake.stream_query_result = cu::CUDA_ERROR_LAUNCH_FAILED;
  absl::Status s = devices->CheckStream(0, stream);
  CHECK(s.code() == absl::StatusCode::kInternal);
  CHECK(Contains(std::string(s.message()), "sticky error"));
  CHECK_FALSE(devices->CheckUsable(0).ok());
}

TEST_CASE("A context scope pushes and pops the device's context",
          "[cuda_devices]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  {
    CudaContextScope scope(*devices, 0);
    CHECK(scope.status().ok());
    CHECK(FakeCuda::PushedDepth() == 1);
  }
  CHECK(FakeCuda::PushedDepth() == 0);
  CudaContextScope bad(*devices, 5);
  CHECK_FALSE(bad.status().ok());
  CHECK(FakeCuda::PushedDepth() == 0);
}

int Queries(const FakeCuda& fake) {
  int n = 0;
  for (const std::string& c : fake.calls) n += c == "cuStreamQuery";
  return n;
}

TEST_CASE("The sticky-error watch queries without blocking and finds a fault",
          "[cuda_devices]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  fake.EnqueueKernel();  // pending GPU work is no error
  CHECK(devices->PollSticky().ok());
  CHECK(Queries(fake) == 1);  // the device's private probe stream
  CHECK(fake.live_streams == 1);
  auto session_stream = reinterpret_cast<cu::CUstream>(0x2f01);
  devices->Watch(0, session_stream);
  fake.calls.clear();
  CHECK(devices->PollSticky().ok());
  CHECK(Queries(fake) == 2);  // and the watched session stream
  CHECK(FakeCuda::PushedDepth() == 0);
  CHECK(fake.stream_syncs == 0);  // never waits for the GPU

  // The kernel faulted after its handler returned.
  fake.stream_query_result = cu::CUDA_ERROR_ILLEGAL_ADDRESS;
  cu::CUresult sticky = cu::CUDA_SUCCESS;
  int ordinal = -1;
  absl::Status s = devices->PollSticky(&sticky, &ordinal);
  CHECK(s.code() == absl::StatusCode::kInternal);
  CHECK(Contains(std::string(s.message()),
                 "hit a sticky error in the executor's sticky-error watch "
                 "(cuStreamQuery): CUDA_ERROR_ILLEGAL_ADDRESS (700)"));
  CHECK(sticky == cu::CUDA_ERROR_ILLEGAL_ADDRESS);
  CHECK(ordinal == 0);
  CHECK_FALSE(devices->CheckUsable(0).ok());
  CHECK(FakeCuda::PushedDepth() == 0);
  // Reported again, without asking the driver, on every later poll.
  fake.calls.clear();
  CHECK(devices->PollSticky() == s);
  CHECK(Queries(fake) == 0);
  devices->Unwatch(session_stream);
  devices.reset();
  CHECK(fake.live_streams == 0);  // the probe stream is destroyed
}

TEST_CASE("The watch reports a sticky error a launch's probe found first",
          "[cuda_devices]") {
  FakeCuda fake;
  fake.devices.push_back(FakeCuda::Device{FakeCuda::Uuid(0xb1), "Fake B"});
  auto devices = CudaDevices::Open(fake.driver(), "");
  absl::Status first =
      devices->Check(1, cu::CUDA_ERROR_LAUNCH_FAILED, "the session stream");
  cu::CUresult sticky = cu::CUDA_SUCCESS;
  int ordinal = -1;
  CHECK(devices->PollSticky(&sticky, &ordinal) == first);
  CHECK(sticky == cu::CUDA_ERROR_LAUNCH_FAILED);
  CHECK(ordinal == 1);
}

TEST_CASE("The watch ignores errors that are not sticky", "[cuda_devices]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  fake.FailNext("cuStreamQuery", cu::CUDA_ERROR_INVALID_HANDLE);
  CHECK(devices->PollSticky().ok());
  CHECK(devices->CheckUsable(0).ok());
  // Unwatching a stream never watched is harmless.
  devices->Unwatch(reinterpret_cast<cu::CUstream>(0x2f02));
  CHECK(devices->PollSticky().ok());
}

TEST_CASE("Without a driver the watch has nothing to poll", "[cuda_devices]") {
  auto devices = CudaDevices::Open(nullptr, "no CUDA driver: test");
  CHECK(devices->PollSticky().ok());
}

}  // namespace
}  // namespace kreg
