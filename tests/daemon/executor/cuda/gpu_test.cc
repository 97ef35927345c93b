// daemon/executor/cuda against the machine's real driver and GPU. On a machine
// without either (CI), every case says so with a "skipped: " WARN, which
// tools/summarize_tests.py counts as a skip.
#include <string>

#include "catch2/catch.hpp"
#include "client/shim/cuda/cuda_export.h"
#include "client/shim/cuda/staging_buffer.h"
#include "daemon/executor/cuda/cuda_devices.h"
#include "daemon/executor/cuda/cuda_session.h"

namespace kreg {
namespace {

// The machine's devices, or null after a visible "skipped" warning.
std::unique_ptr<CudaDevices> DevicesOrSkip() {
  auto devices = CudaDevices::OpenSystem();
  if (!devices->status().ok()) {
    WARN("skipped: no CUDA device: " << devices->status().message());
    return nullptr;
  }
  return devices;
}

TEST_CASE("kregd sees the machine's GPUs by UUID", "[cuda]") {
  auto devices = DevicesOrSkip();
  if (devices == nullptr) return;
  REQUIRE(devices->count() > 0);
  const CudaDeviceInfo& d = devices->info(0);
  INFO(devices->Describe());
  CHECK(d.uuid_text.rfind("GPU-", 0) == 0);
  CHECK(*devices->FindByUuid(std::string(d.uuid.bytes, 16)) == 0);
}

TEST_CASE("A real session stream runs stream-ordered scratch", "[cuda]") {
  auto devices = DevicesOrSkip();
  if (devices == nullptr) return;
  CudaSession session(devices.get());
  absl::Status s = session.Launch(0, [](const CallOptions& o) {
    absl::StatusOr<void*> p = o.device_allocator->Allocate(1 << 20, 4096);
    if (!p.ok()) return p.status();
    return o.device_allocator->Free(*p, 1 << 20);
  });
  CHECK(s.ok());
  CHECK(devices->CheckUsable(0).ok());
}

TEST_CASE("A VMM allocation exported by the client side is imported by kregd",
          "[cuda]") {
  auto devices = DevicesOrSkip();
  if (devices == nullptr) return;
  const cu::CudaDriver* d = devices->driver();
  std::unique_ptr<cuda_client::StagingBuffer> staging;
  ClientStatus s = cuda_client::StagingBuffer::Create(d, 0, 3 << 20, &staging);
  REQUIRE(s.message == "");
  cuda_client::ExportedBuffer e;
  s = staging->Export(&e);
  REQUIRE(s.message == "");
  CHECK(e.kind == cuda_client::ExportKind::kVmmFd);
  CHECK(e.id.generation != 0);  // CU_POINTER_ATTRIBUTE_BUFFER_ID
  INFO("base " << e.id.base << " size " << e.id.size);
  CHECK(e.id.size == staging->size());
  CudaSession session(devices.get());
  const CudaMappingKey key{e.id.device_uuid, e.id.base, e.id.size,
                           e.id.generation};
  REQUIRE(session.ShareVmm(key, std::move(e.fd)).ok());
  auto r = session.Resolve(key, 4096, 4096);
  REQUIRE(r.ok());
  CHECK(r->mapping->base() != e.id.base);  // kregd's own mapping
  absl::Status copy = session.Launch(0, [&](const CallOptions& o) {
    return CuStatus(*d,
                    d->cuMemcpyDtoDAsync(reinterpret_cast<uintptr_t>(r->data),
                                         staging->data(), 4096,
                                         static_cast<cu::CUstream>(o.stream)),
                    "cuMemcpyDtoDAsync");
  });
  CHECK(copy.ok());
}

}  // namespace
}  // namespace kreg
