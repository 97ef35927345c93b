// The driver loader and the driver-independent helpers of cuda_driver.h.
#include "common/cuda_driver.h"

#include <string>

#include "catch2/catch.hpp"
#include "tests/testing/fake_cuda.h"

namespace kreg {
namespace {

using testing::FakeCuda;

TEST_CASE("A missing libcuda is reported as no CUDA driver", "[cuda_driver]") {
  std::string error;
  const cu::CudaDriver* d =
      cu::LoadCudaDriverFrom("libcuda-kreg-missing.so.1", &error);
  CHECK(d == nullptr);
  CHECK(error.rfind("no CUDA driver: dlopen(\"libcuda-kreg-missing.so.1\") "
                    "failed: ",
                    0) == 0);
}

TEST_CASE("A library without the driver's symbols names the missing one",
          "[cuda_driver]") {
  std::string error;
  const cu::CudaDriver* d = cu::LoadCudaDriverFrom("libc.so.6", &error);
  CHECK(d == nullptr);
  CHECK(error ==
        "CUDA driver too old: libc.so.6 lacks cuGetErrorName (kregd needs a "
        "driver for CUDA 12.0 or newer)");
}

TEST_CASE("LoadCudaDriver either loads libcuda.so.1 or says why not",
          "[cuda_driver]") {
  std::string error;
  const cu::CudaDriver* d = cu::LoadCudaDriver(&error);
  if (d == nullptr) {
    WARN("this machine has no CUDA driver: " << error);
    CHECK(error.find("no CUDA driver") == 0);
  } else {
    CHECK(d->cuInit != nullptr);
    CHECK(cu::LoadCudaDriver() == d);  // loaded once
  }
}

TEST_CASE("Sticky CUDA errors are told apart from ordinary ones",
          "[cuda_driver]") {
  for (cu::CUresult r :
       {cu::CUDA_ERROR_ILLEGAL_ADDRESS, cu::CUDA_ERROR_LAUNCH_FAILED,
        cu::CUDA_ERROR_ASSERT, cu::CUDA_ERROR_MISALIGNED_ADDRESS,
        cu::CUDA_ERROR_ILLEGAL_INSTRUCTION, cu::CUDA_ERROR_ECC_UNCORRECTABLE,
        cu::CUDA_ERROR_HARDWARE_STACK_ERROR}) {
    CHECK(cu::IsStickyCuError(r));
  }
  for (cu::CUresult r :
       {cu::CUDA_SUCCESS, cu::CUDA_ERROR_NOT_READY,
        cu::CUDA_ERROR_INVALID_VALUE, cu::CUDA_ERROR_OUT_OF_MEMORY,
        cu::CUDA_ERROR_NO_DEVICE}) {
    CHECK_FALSE(cu::IsStickyCuError(r));
  }
}

TEST_CASE("UUIDs print as nvidia-smi prints them", "[cuda_driver]") {
  cu::CUuuid uuid;
  for (int i = 0; i < 16; ++i) uuid.bytes[i] = static_cast<char>(i * 17);
  CHECK(cu::FormatCuUuid(uuid) == "GPU-00112233-4455-6677-8899-aabbccddeeff");
}

TEST_CASE("CUresults are described by name, code and text", "[cuda_driver]") {
  FakeCuda fake;
  CHECK(cu::DescribeCuResult(*fake.driver(), cu::CUDA_ERROR_ILLEGAL_ADDRESS) ==
        "CUDA_ERROR_ILLEGAL_ADDRESS (700): an illegal memory access was "
        "encountered");
  CHECK(cu::DescribeCuResult(*fake.driver(), 12345) == "CUresult 12345");
}

}  // namespace
}  // namespace kreg
