// daemon/cuda against the machine's real driver and GPU. On a machine without
// either (CI), every case says so with a WARN and passes.
#include <string>

#include "catch2/catch.hpp"
#include "daemon/cuda/cuda_devices.h"
#include "daemon/cuda/cuda_session.h"

namespace kreg {
namespace {

// The machine's devices, or null after a visible "skipped" warning.
std::unique_ptr<CudaDevices> DevicesOrSkip() {
  auto devices = CudaDevices::OpenSystem();
  if (!devices->status().ok()) {
    WARN("SKIP [cuda]: no CUDA device: " << devices->status().message());
    return nullptr;
  }
  return devices;
}

TEST_CASE("kregd sees the machine's GPUs by UUID", "[cuda]") {
  auto devices = DevicesOrSkip();
  if (devices == nullptr) {
    SUCCEED("skipped: no CUDA device");
    return;
  }
  REQUIRE(devices->count() > 0);
  const CudaDeviceInfo& d = devices->info(0);
  INFO(devices->Describe());
  CHECK(d.uuid_text.rfind("GPU-", 0) == 0);
  CHECK(*devices->FindByUuid(std::string(d.uuid.bytes, 16)) == 0);
}

TEST_CASE("A real session stream runs stream-ordered scratch", "[cuda]") {
  auto devices = DevicesOrSkip();
  if (devices == nullptr) {
    SUCCEED("skipped: no CUDA device");
    return;
  }
  CudaSession session(devices.get());
  absl::Status s = session.Launch(0, [](const CallOptions& o) {
    absl::StatusOr<void*> p = o.device_allocator->Allocate(1 << 20, 4096);
    if (!p.ok()) return p.status();
    return o.device_allocator->Free(*p, 1 << 20);
  });
  CHECK(s.ok());
  CHECK(devices->CheckUsable(0).ok());
}

}  // namespace
}  // namespace kreg
