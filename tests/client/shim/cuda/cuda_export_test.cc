// //client/shim/cuda over the fake driver: identifying and exporting buffers of
// every kind, interprocess events, staging buffers, and what happens without
// a driver. Exports are checked end to end against the daemon side
// (CudaSession) running on the same fake.
#include "client/shim/cuda/cuda_export.h"

#include <fcntl.h>

#include <algorithm>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "client/shim/cuda/ipc_events.h"
#include "client/shim/cuda/staging_buffer.h"
#include "daemon/executor/cuda/cuda_session.h"
#include "tests/testing/fake_cuda.h"

namespace kreg::cuda_client {
namespace {

using testing::FakeCuda;

constexpr uint64_t kMiB = 1 << 20;

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

const void* Ptr(uint64_t address) {
  return reinterpret_cast<const void*>(static_cast<uintptr_t>(address));
}

CudaMappingKey KeyOf(const AllocationId& id) {
  return CudaMappingKey{id.device_uuid, id.base, id.size, id.generation};
}

TEST_CASE("Without a driver every client call says so", "[client_cuda]") {
  AllocationId id;
  ExportedBuffer e;
  std::string uuid;
  std::unique_ptr<IpcEventPair> events;
  std::unique_ptr<StagingBuffer> staging;
  for (const ClientStatus& s :
       {IdentifyBuffer(nullptr, Ptr(0x1000), &id),
        ExportBuffer(nullptr, Ptr(0x1000), &e), DeviceUuid(nullptr, 0, &uuid),
        StreamDevice(nullptr, nullptr, nullptr, nullptr, &uuid),
        IpcEventPair::Create(nullptr, nullptr, &events),
        StagingBuffer::Create(nullptr, 0, kMiB, &staging)}) {
    CHECK(s.code == kUnavailable);
    CHECK(Contains(s.message, "no CUDA driver in this process"));
  }
}

TEST_CASE("ProcessDriver loads libcuda.so.1 or says why not", "[client_cuda]") {
  ClientStatus s;
  const cu::CudaDriver* d = ProcessDriver(&s);
  if (d == nullptr) {
    WARN("this machine has no CUDA driver: " << s.message);
    CHECK(s.code == kUnavailable);
    CHECK(s.message.rfind("no CUDA driver: dlopen(\"libcuda.so.1\")", 0) == 0);
  }
}

TEST_CASE("A pointer that is not device memory is INVALID_ARGUMENT",
          "[client_cuda]") {
  FakeCuda fake;
  int host = 0;
  AllocationId id;
  ClientStatus s = IdentifyBuffer(fake.driver(), &host, &id);
  CHECK(s.code == kInvalidArgument);
  CHECK(Contains(s.message, "is not CUDA device memory of this process"));
}

TEST_CASE("A buffer is identified by device UUID, mapping and generation",
          "[client_cuda]") {
  FakeCuda fake;
  const uint64_t a =
      fake.ClientAllocation(FakeCuda::Kind::kVmmPosixFd, 8 * kMiB);
  const uint64_t b =
      fake.ClientAllocation(FakeCuda::Kind::kVmmPosixFd, 8 * kMiB);
  AllocationId ia, ib;
  uint64_t offset = 0;
  REQUIRE(IdentifyBuffer(fake.driver(), Ptr(a + 4096), &ia, &offset).ok());
  REQUIRE(IdentifyBuffer(fake.driver(), Ptr(b), &ib).ok());
  CHECK(ia.device_uuid == FakeCuda::Uuid(0xa0));
  CHECK(ia.device_ordinal == 0);
  CHECK(ia.base == a);
  CHECK(ia.size == 8 * kMiB);
  CHECK(offset == 4096);
  CHECK(ia.generation != 0);
  CHECK(ia.generation != ib.generation);
  CHECK(FakeCuda::PushedDepth() == 0);
}

TEST_CASE("A buffer identified before costs one driver call", "[client_cuda]") {
  FakeCuda fake;
  const uint64_t a =
      fake.ClientAllocation(FakeCuda::Kind::kVmmPosixFd, 8 * kMiB);
  AllocationId first, again;
  uint64_t offset = 0;
  REQUIRE(IdentifyBuffer(fake.driver(), Ptr(a), &first).ok());
  fake.calls.clear();
  REQUIRE(IdentifyBuffer(fake.driver(), Ptr(a + 8192), &again, &offset).ok());
  CHECK(fake.calls == std::vector<std::string>{"cuPointerGetAttributes"});
  CHECK(again.base == first.base);
  CHECK(again.size == first.size);
  CHECK(again.generation == first.generation);
  CHECK(again.device_uuid == first.device_uuid);
  CHECK(offset == 8192);
  // Another allocation (another buffer ID) is identified in full.
  const uint64_t b =
      fake.ClientAllocation(FakeCuda::Kind::kVmmPosixFd, 8 * kMiB);
  fake.calls.clear();
  AllocationId other;
  REQUIRE(IdentifyBuffer(fake.driver(), Ptr(b), &other).ok());
  CHECK(std::count(fake.calls.begin(), fake.calls.end(),
                   "cuMemGetAddressRange") == 1);
  CHECK(other.generation != first.generation);
}

TEST_CASE("VMM memory is exported as a POSIX fd that kregd imports",
          "[client_cuda]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  CudaSession session(devices.get());
  const uint64_t base =
      fake.ClientAllocation(FakeCuda::Kind::kVmmPosixFd, 16 * kMiB);
  ExportedBuffer e;
  REQUIRE(ExportBuffer(fake.driver(), Ptr(base + 1024), &e).ok());
  CHECK(e.kind == ExportKind::kVmmFd);
  CHECK(e.offset == 1024);
  CHECK(e.fd.ok());
  CHECK(e.retained.held());
  CHECK(fake.live_handles == 1);  // the client's retained handle
  REQUIRE(session.ShareVmm(KeyOf(e.id), std::move(e.fd)).ok());
  auto r = session.Resolve(KeyOf(e.id), e.offset, 4096);
  REQUIRE(r.ok());
  CHECK(reinterpret_cast<uintptr_t>(r->data) == r->mapping->base() + 1024);
  e.retained.Reset();
  CHECK(fake.live_handles == 1);  // kregd's import remains
}

TEST_CASE("cudaMalloc memory is exported with legacy IPC in its context",
          "[client_cuda]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  CudaSession session(devices.get());
  const uint64_t base =
      fake.ClientAllocation(FakeCuda::Kind::kCudaMalloc, 1000);
  ExportedBuffer e;
  REQUIRE(ExportBuffer(fake.driver(), Ptr(base + 8), &e).ok());
  CHECK(e.kind == ExportKind::kLegacyIpc);
  CHECK(e.offset == 8);
  CHECK_FALSE(e.fd.ok());
  CHECK_FALSE(e.retained.held());
  CHECK(FakeCuda::PushedDepth() == 0);
  REQUIRE(session.ShareIpc(KeyOf(e.id), e.ipc_handle).ok());
  CHECK(session.Resolve(KeyOf(e.id), 8, 992).ok());
}

TEST_CASE("Memory that is neither exportable nor cudaMalloc needs staging",
          "[client_cuda]") {
  FakeCuda fake;
  const uint64_t pool = fake.ClientAllocation(FakeCuda::Kind::kPool, kMiB);
  ExportedBuffer e;
  REQUIRE(ExportBuffer(fake.driver(), Ptr(pool), &e).ok());
  CHECK(e.kind == ExportKind::kNeedsStaging);
  CHECK(Contains(e.staging_reason,
                 "cuMemRetainAllocationHandle: CUDA_ERROR_INVALID_VALUE"));
  CHECK(Contains(e.staging_reason,
                 "cuIpcGetMemHandle: CUDA_ERROR_INVALID_VALUE"));

  const uint64_t vmm =
      fake.ClientAllocation(FakeCuda::Kind::kVmmNoExport, kMiB);
  ExportedBuffer f;
  REQUIRE(ExportBuffer(fake.driver(), Ptr(vmm), &f).ok());
  CHECK(f.kind == ExportKind::kNeedsStaging);
  CHECK(Contains(f.staging_reason, "not created exportable as a POSIX fd"));
  CHECK_FALSE(f.retained.held());
  CHECK(fake.live_handles == 0);  // the retained handle was released
}

TEST_CASE("A stream names its device", "[client_cuda]") {
  FakeCuda fake;
  cu::CUcontext ctx = nullptr;
  int ordinal = -1;
  std::string uuid;
  REQUIRE(StreamDevice(fake.driver(), reinterpret_cast<cu::CUstream>(0x2001),
                       &ctx, &ordinal, &uuid)
              .ok());
  CHECK(ctx != nullptr);
  CHECK(ordinal == 0);
  CHECK(uuid == FakeCuda::Uuid(0xa0));
  CHECK(FakeCuda::PushedDepth() == 0);
}

TEST_CASE("A context's device is asked once; a new context is asked again",
          "[client_cuda]") {
  FakeCuda fake;
  const auto stream = reinterpret_cast<cu::CUstream>(0x2001);
  cu::CUcontext ctx = nullptr;
  int ordinal = -1;
  std::string uuid;
  REQUIRE(StreamDevice(fake.driver(), stream, &ctx, &ordinal, &uuid).ok());
  fake.calls.clear();
  cu::CUcontext ctx2 = nullptr;
  int ordinal2 = -1;
  std::string uuid2;
  REQUIRE(StreamDevice(fake.driver(), stream, &ctx2, &ordinal2, &uuid2).ok());
  CHECK(fake.calls == std::vector<std::string>{"cuStreamGetCtx", "cuCtxGetId"});
  CHECK(ctx2 == ctx);
  CHECK(ordinal2 == ordinal);
  CHECK(uuid2 == uuid);
  CHECK(FakeCuda::PushedDepth() == 0);
  // The context was destroyed and another made at its address: its ID is
  // new, so the device is asked again.
  ++fake.context_epoch;
  fake.calls.clear();
  REQUIRE(StreamDevice(fake.driver(), stream, &ctx2, &ordinal2, &uuid2).ok());
  CHECK(std::count(fake.calls.begin(), fake.calls.end(), "cuDeviceGetUuid") ==
        1);
  CHECK(uuid2 == FakeCuda::Uuid(0xa0));
  // A failing cuCtxGetId: the device is asked.
  fake.FailNext("cuCtxGetId", cu::CUDA_ERROR_INVALID_CONTEXT);
  fake.calls.clear();
  REQUIRE(StreamDevice(fake.driver(), stream, &ctx2, &ordinal2, &uuid2).ok());
  CHECK(std::count(fake.calls.begin(), fake.calls.end(), "cuDeviceGetUuid") ==
        1);
  // A driver without cuCtxGetId: asked every time.
  fake.DisableCtxGetId();
  for (int i = 0; i < 2; ++i) {
    fake.calls.clear();
    REQUIRE(StreamDevice(fake.driver(), stream, &ctx2, &ordinal2, &uuid2).ok());
    CHECK(std::count(fake.calls.begin(), fake.calls.end(), "cuDeviceGetUuid") ==
          1);
  }
}

TEST_CASE("PushContext pushes nothing when the context is already current",
          "[client_cuda]") {
  FakeCuda fake;
  const cu::CudaDriver& d = *fake.driver();
  const auto a = reinterpret_cast<cu::CUcontext>(uintptr_t{0x1000});
  const auto b = reinterpret_cast<cu::CUcontext>(uintptr_t{0x1001});
  {
    PushContext none(d, nullptr);
    CHECK(FakeCuda::PushedDepth() == 0);
  }
  REQUIRE(d.cuCtxPushCurrent(a) == cu::CUDA_SUCCESS);
  fake.calls.clear();
  {
    PushContext same(d, a);
    CHECK(FakeCuda::PushedDepth() == 1);
    {
      PushContext other(d, b);
      CHECK(FakeCuda::PushedDepth() == 2);
      cu::CUcontext cur = nullptr;
      d.cuCtxGetCurrent(&cur);
      CHECK(cur == b);
    }
    CHECK(FakeCuda::PushedDepth() == 1);
  }
  CHECK(FakeCuda::PushedDepth() == 1);
  CHECK(fake.calls == std::vector<std::string>{"cuCtxPushCurrent"});
  cu::CUcontext popped;
  d.cuCtxPopCurrent(&popped);
}

TEST_CASE("An interprocess event pair is made and opened by kregd",
          "[client_cuda]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  cu::CUcontext ctx = nullptr;
  REQUIRE(StreamDevice(fake.driver(), reinterpret_cast<cu::CUstream>(0x2001),
                       &ctx, nullptr, nullptr)
              .ok());
  {
    std::unique_ptr<IpcEventPair> pair;
    REQUIRE(IpcEventPair::Create(fake.driver(), ctx, &pair).ok());
    CHECK(fake.live_events == 2);
    CudaSession session(devices.get());
    REQUIRE(session
                .SetEvents(FakeCuda::Uuid(0xa0), pair->ready_handle(),
                           pair->done_handle())
                .ok());
    auto stream = reinterpret_cast<cu::CUstream>(0x2001);
    CHECK(pair->RecordReady(stream).ok());
    CHECK(session.Launch(0, [](const CallOptions&) { return absl::OkStatus(); })
              .ok());
    CHECK(pair->WaitDone(stream).ok());
    // The client's record, kregd's wait and record, the client's wait; the
    // fake names kregd's opened handles event0/event1.
    CHECK(fake.event_log ==
          std::vector<std::string>{"record local-ipc", "wait event0",
                                   "record event1", "wait local-ipc"});
  }
  CHECK(fake.live_events == 0);
  CHECK(FakeCuda::PushedDepth() == 0);
}

TEST_CASE("A staging buffer is device memory kregd can import",
          "[client_cuda]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  {
    std::unique_ptr<StagingBuffer> staging;
    REQUIRE(StagingBuffer::Create(fake.driver(), 0, 3 * kMiB, &staging).ok());
    CHECK(staging->size() == 4 * kMiB);  // rounded to the granularity
    ExportedBuffer e;
    REQUIRE(staging->Export(&e).ok());
    CHECK(e.kind == ExportKind::kVmmFd);
    CHECK(e.id.size == 4 * kMiB);
    CudaSession session(devices.get());
    REQUIRE(session.ShareVmm(KeyOf(e.id), std::move(e.fd)).ok());
  }
  CHECK(fake.live_maps == 0);
  CHECK(fake.live_reservations == 0);
  CHECK(fake.live_handles == 0);
}

TEST_CASE("A staging buffer of 0 bytes is refused", "[client_cuda]") {
  FakeCuda fake;
  std::unique_ptr<StagingBuffer> staging;
  CHECK(StagingBuffer::Create(fake.driver(), 0, 0, &staging).code ==
        kInvalidArgument);
}

}  // namespace
}  // namespace kreg::cuda_client
