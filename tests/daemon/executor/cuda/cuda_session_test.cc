// CudaSession, SessionStreams and StreamOrderedAllocator over a fake driver:
// the launch sequence, stream-ordered scratch, sharing and release.
#include "daemon/executor/cuda/cuda_session.h"

#include <fcntl.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "catch2/catch.hpp"
#include "tests/testing/fake_cuda.h"

namespace kreg {
namespace {

using testing::FakeCuda;

constexpr uint64_t kMiB = 1 << 20;

bool Contains(const absl::Status& s, const std::string& part) {
  return std::string(s.message()).find(part) != std::string::npos;
}

CudaMappingKey Key(uint64_t base, uint64_t size, uint64_t gen = 1) {
  return CudaMappingKey{FakeCuda::Uuid(0xa0), base, size, gen};
}

TEST_CASE("A launch runs on the session stream with a scratch allocator",
          "[cuda_session]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  {
    CudaSession session(devices.get());
    cu::CUstream seen = nullptr;
    for (int i = 0; i < 3; ++i) {
      absl::Status s = session.Launch(0, [&](const CallOptions& o) {
        CHECK(o.stream != nullptr);
        CHECK(o.device_allocator != nullptr);
        CHECK(FakeCuda::PushedDepth() == 1);  // the device's context is current
        if (seen != nullptr) CHECK(o.stream == seen);
        seen = static_cast<cu::CUstream>(o.stream);
        fake.EnqueueKernel();
        return absl::OkStatus();
      });
      CHECK(s.ok());
    }
    CHECK(fake.live_streams == 1);
    CHECK(FakeCuda::PushedDepth() == 0);
    CHECK(fake.stream_syncs == 0);  // nothing synchronises on the launch path
  }
  CHECK(fake.live_streams == 0);
  CHECK(fake.stream_syncs == 1);  // session close waits for its work
}

TEST_CASE("A launch waits for the client's event and records its own",
          "[cuda_session]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  CudaSession session(devices.get());
  const cu::CUipcEventHandle ready = fake.IpcEvent();  // "event0"
  const cu::CUipcEventHandle done = fake.IpcEvent();   // "event1"
  REQUIRE(session.SetEvents(FakeCuda::Uuid(0xa0), ready, done).ok());
  absl::Status s = session.Launch(0, [&](const CallOptions&) {
    fake.event_log.push_back("handler");
    return absl::OkStatus();
  });
  CHECK(s.ok());
  CHECK(fake.event_log ==
        std::vector<std::string>{"wait event0", "handler", "record event1"});
}

TEST_CASE("A handler's error comes back verbatim and done is still recorded",
          "[cuda_session]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  CudaSession session(devices.get());
  const cu::CUipcEventHandle ready = fake.IpcEvent();  // "event0"
  const cu::CUipcEventHandle done = fake.IpcEvent();   // "event1"
  REQUIRE(session.SetEvents(FakeCuda::Uuid(0xa0), ready, done).ok());
  absl::Status s = session.Launch(0, [](const CallOptions&) {
    return absl::InvalidArgumentError("demo.Fail: refused on purpose (code=7)");
  });
  CHECK(s ==
        absl::InvalidArgumentError("demo.Fail: refused on purpose (code=7)"));
  CHECK(fake.event_log.back() == "record event1");
}

TEST_CASE("Events for a GPU kregd does not see are refused", "[cuda_session]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  CudaSession session(devices.get());
  absl::Status s =
      session.SetEvents(FakeCuda::Uuid(0x77), fake.IpcEvent(), fake.IpcEvent());
  CHECK(s.code() == absl::StatusCode::kNotFound);
}

TEST_CASE("A sticky error after a launch is reported and stops the device",
          "[cuda_session]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  CudaSession session(devices.get());
  absl::Status s = session.Launch(0, [&](const CallOptions&) {
    fake.stream_query_result = cu::CUDA_ERROR_ILLEGAL_ADDRESS;
    return absl::OkStatus();
  });
  CHECK(s.code() == absl::StatusCode::kInternal);
  CHECK(Contains(s, "hit a sticky error"));
  CHECK(Contains(s, "CUDA_ERROR_ILLEGAL_ADDRESS"));
  bool ran = false;
  absl::Status again = session.Launch(0, [&](const CallOptions&) {
    ran = true;
    return absl::OkStatus();
  });
  CHECK_FALSE(ran);
  CHECK(again == s);
}

TEST_CASE("Scratch memory is allocated and freed on the session stream",
          "[cuda_session]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  CudaSession session(devices.get());
  absl::Status s = session.Launch(0, [&](const CallOptions& o) {
    absl::StatusOr<void*> a = o.device_allocator->Allocate(1000, 64);
    REQUIRE(a.ok());
    CHECK(reinterpret_cast<uintptr_t>(*a) % 64 == 0);
    absl::StatusOr<void*> big = o.device_allocator->Allocate(1000, 4096);
    REQUIRE(big.ok());
    CHECK(reinterpret_cast<uintptr_t>(*big) % 4096 == 0);
    CHECK(fake.live_pool_allocs == 2);
    CHECK(o.device_allocator->Free(*a, 1000).ok());
    CHECK(o.device_allocator->Free(*big, 1000).ok());
    CHECK(fake.live_pool_allocs == 0);
    CHECK(*o.device_allocator->Allocate(0, 1) == nullptr);
    CHECK(o.device_allocator->Free(nullptr, 0).ok());
    return absl::OkStatus();
  });
  CHECK(s.ok());
  // Allocated and freed in stream order, never synchronised.
  CHECK(fake.stream_syncs == 0);
}

TEST_CASE("The scratch allocator refuses bad requests", "[cuda_session]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  auto stream = reinterpret_cast<cu::CUstream>(0x2001);
  StreamOrderedAllocator alloc(devices.get(), 0, stream);
  CHECK(alloc.Allocate(64, 3).status().code() ==
        absl::StatusCode::kInvalidArgument);
  int local = 0;
  absl::Status bad_free = alloc.Free(&local, 4);
  CHECK(bad_free.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(bad_free, "not allocated by this call's allocator"));
  fake.FailNext("cuMemAllocAsync", cu::CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(alloc.Allocate(64, 64).status().code() ==
        absl::StatusCode::kResourceExhausted);
}

TEST_CASE("Scratch still allocated is freed when the allocator goes",
          "[cuda_session]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  {
    StreamOrderedAllocator alloc(devices.get(), 0,
                                 reinterpret_cast<cu::CUstream>(0x2001));
    REQUIRE(alloc.Allocate(64, 64).ok());
    CHECK(alloc.live_allocations() == 1);
  }
  CHECK(fake.live_pool_allocs == 0);
}

TEST_CASE("Devices without memory pools offer no scratch", "[cuda_session]") {
  FakeCuda fake;
  fake.devices[0].memory_pools = false;
  auto devices = CudaDevices::Open(fake.driver(), "");
  StreamOrderedAllocator alloc(devices.get(), 0,
                               reinterpret_cast<cu::CUstream>(0x2001));
  CHECK(alloc.Allocate(64, 64).status().code() ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("A shared VMM allocation resolves to kregd's mapping plus offset",
          "[cuda_session]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  CudaSession session(devices.get());
  const CudaMappingKey key = Key(0x7000000, 4 * kMiB);
  REQUIRE(
      session.ShareVmm(key, UniqueFd(fake.ExportAllocation(4 * kMiB))).ok());
  // Sent again (the client lost track): no second import, fd just closed.
  const int again = fake.ExportAllocation(4 * kMiB);
  REQUIRE(session.ShareVmm(key, UniqueFd(again)).ok());
  CHECK(fcntl(again, F_GETFD) == -1);
  CHECK(fake.live_handles == 1);
  auto r = session.Resolve(key, 4096, 1024);
  REQUIRE(r.ok());
  CHECK(reinterpret_cast<uintptr_t>(r->data) == r->mapping->base() + 4096);
  CHECK(session.Resolve(key, 4 * kMiB - 10, 11).status().code() ==
        absl::StatusCode::kOutOfRange);
}

TEST_CASE("Sharing memory of a GPU kregd does not see is NOT_FOUND",
          "[cuda_session]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  CudaSession session(devices.get());
  CudaMappingKey key = Key(0x7000000, 2 * kMiB);
  key.device_uuid = FakeCuda::Uuid(0x55);
  absl::Status s =
      session.ShareVmm(key, UniqueFd(fake.ExportAllocation(2 * kMiB)));
  CHECK(s.code() == absl::StatusCode::kNotFound);
  CHECK(Contains(s, "kregd's devices: GPU-a0a0a0a0"));
  CHECK(fake.live_handles == 0);
}

TEST_CASE("Legacy IPC memory is shared and resolved", "[cuda_session]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  {
    CudaSession session(devices.get());
    const CudaMappingKey key = Key(0x9000000, 1000);
    REQUIRE(session.ShareIpc(key, fake.IpcAllocation(1000)).ok());
    CHECK(session.Resolve(key, 0, 1000).ok());
    CHECK(fake.live_ipc_opens == 1);
  }
  CHECK(fake.live_ipc_opens == 0);
}

TEST_CASE("Evicted mappings are released once the GPU passed their fence",
          "[cuda_session]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  CudaSessionOptions options;
  options.cache.max_entries = 1;
  CudaSession session(devices.get(), options);
  // A launch creates the stream, so eviction has something to fence.
  REQUIRE(session
              .ShareVmm(Key(0x1000000, 2 * kMiB),
                        UniqueFd(fake.ExportAllocation(2 * kMiB)))
              .ok());
  REQUIRE(session
              .Launch(0,
                      [&](const CallOptions&) {
                        fake.EnqueueKernel();
                        return absl::OkStatus();
                      })
              .ok());
  REQUIRE(session
              .ShareVmm(Key(0x2000000, 2 * kMiB),
                        UniqueFd(fake.ExportAllocation(2 * kMiB)))
              .ok());
  CHECK(fake.live_maps == 2);  // the kernel may still use the first
  CHECK(session.mappings().retired() == 1);
  fake.CompleteAll();
  REQUIRE(session.Launch(0, [](const CallOptions&) { return absl::OkStatus(); })
              .ok());  // launches reap
  CHECK(fake.live_maps == 1);
  CHECK(session.mappings().retired() == 0);
}

TEST_CASE("Closing a session releases all it held", "[cuda_session]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  {
    CudaSession session(devices.get());
    REQUIRE(session
                .ShareVmm(Key(0x1000000, 2 * kMiB),
                          UniqueFd(fake.ExportAllocation(2 * kMiB)))
                .ok());
    REQUIRE(
        session
            .SetEvents(FakeCuda::Uuid(0xa0), fake.IpcEvent(), fake.IpcEvent())
            .ok());
    REQUIRE(session
                .Launch(0,
                        [&](const CallOptions& o) {
                          REQUIRE(o.device_allocator->Allocate(64, 64).ok());
                          fake.EnqueueKernel();
                          return absl::OkStatus();
                        })
                .ok());
  }
  CHECK(fake.live_maps == 0);
  CHECK(fake.live_reservations == 0);
  CHECK(fake.live_handles == 0);
  CHECK(fake.live_events == 0);
  CHECK(fake.live_streams == 0);
  CHECK(fake.live_pool_allocs == 0);
  CHECK(FakeCuda::PushedDepth() == 0);
}

// --- The doorbell (stream memops) -----------------------------------------

constexpr uint64_t kReadyOff = 0;
constexpr uint64_t kDoneOff = 128;

// Session close does not wait for the fake GPU, which never runs the waits.
CudaSessionOptions NoGrace() {
  CudaSessionOptions o;
  o.doorbell_grace = std::chrono::milliseconds(0);
  return o;
}

absl::Status SetBell(FakeCuda& fake, CudaSession& session,
                     unsigned char uuid = 0xa0) {
  return session.SetDoorbell(FakeCuda::Uuid(uuid),
                             UniqueFd(fake.ExportAllocation(2 * kMiB)),
                             2 * kMiB, kReadyOff, kDoneOff);
}

TEST_CASE("Setting up a doorbell maps it and zeroes both words first",
          "[cuda_session][doorbell]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  CudaSession session(devices.get(), NoGrace());
  REQUIRE(SetBell(fake, session).ok());
  CHECK(session.HasDoorbell(0));
  CHECK(fake.live_maps == 1);
  REQUIRE(fake.memops.size() == 2);
  const uint64_t base = fake.maps_.begin()->first;
  CHECK(fake.memops[0].write);
  CHECK(fake.memops[0].addr == base + kReadyOff);
  CHECK(fake.memops[0].value == 0);
  CHECK(fake.memops[1].addr == base + kDoneOff);
  CHECK(fake.memops[1].value == 0);
  CHECK(fake.stream_syncs == 1);  // setup waits for the zeroes, once
  // A second setup for the device is refused.
  CHECK(SetBell(fake, session).code() == absl::StatusCode::kAlreadyExists);
}

TEST_CASE("A doorbell launch waits for ready, runs, then writes done",
          "[cuda_session][doorbell]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  CudaSession session(devices.get(), NoGrace());
  const cu::CUipcEventHandle ready = fake.IpcEvent();  // "event0"
  const cu::CUipcEventHandle done = fake.IpcEvent();   // "event1"
  REQUIRE(session.SetEvents(FakeCuda::Uuid(0xa0), ready, done).ok());
  REQUIRE(SetBell(fake, session).ok());
  const uint64_t base = fake.maps_.begin()->first;
  const int syncs = fake.stream_syncs;
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    fake.memops.clear();
    size_t memops_at_handler = 99;
    void* stream = nullptr;
    bool signalled = false;
    absl::Status s = session.Launch(
        0,
        [&](const CallOptions& o) {
          memops_at_handler = fake.memops.size();
          stream = o.stream;
          return absl::OkStatus();
        },
        seq, &signalled);
    REQUIRE(s.ok());
    CHECK(signalled);
    REQUIRE(fake.memops.size() == 2);
    CHECK(memops_at_handler == 1);  // the wait came before the handler
    CHECK_FALSE(fake.memops[0].write);
    CHECK(fake.memops[0].stream == stream);
    CHECK(fake.memops[0].addr == base + kReadyOff);
    CHECK(fake.memops[0].value == seq);
    CHECK(fake.memops[1].write);
    CHECK(fake.memops[1].stream == stream);
    CHECK(fake.memops[1].addr == base + kDoneOff);
    CHECK(fake.memops[1].value == seq);
  }
  // The doorbell replaces the events, and nothing synchronises.
  CHECK(fake.event_log.empty());
  CHECK(fake.stream_syncs == syncs);
  // A launch without a sequence number still uses the events.
  REQUIRE(session.Launch(0, [](const CallOptions&) { return absl::OkStatus(); })
              .ok());
  CHECK(fake.event_log ==
        std::vector<std::string>{"wait event0", "record event1"});
}

TEST_CASE("A failing doorbell handler still writes done", "[cuda_session]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  CudaSession session(devices.get(), NoGrace());
  REQUIRE(SetBell(fake, session).ok());
  fake.memops.clear();
  bool signalled = false;
  absl::Status s = session.Launch(
      0, [](const CallOptions&) { return absl::InternalError("no"); }, 7,
      &signalled);
  CHECK(s == absl::InternalError("no"));
  CHECK(signalled);
  REQUIRE(fake.memops.size() == 2);
  CHECK(fake.memops[1].write);
  CHECK(fake.memops[1].value == 7);
}

TEST_CASE("Doorbell errors: no doorbell, no memops, bad offsets, failed wait",
          "[cuda_session][doorbell]") {
  FakeCuda fake;
  fake.devices.push_back(FakeCuda::Device{FakeCuda::Uuid(0xb0)});
  fake.devices.back().memops64 = false;
  auto devices = CudaDevices::Open(fake.driver(), "");
  CudaSession session(devices.get(), NoGrace());
  bool ran = false;
  bool signalled = true;
  auto run = [&](const CallOptions&) {
    ran = true;
    return absl::OkStatus();
  };
  absl::Status s = session.Launch(0, run, 1, &signalled);
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Contains(s, "set up no doorbell"));
  CHECK_FALSE(ran);
  CHECK_FALSE(signalled);

  s = SetBell(fake, session, 0xb0);
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Contains(s, "64-bit stream memory operations"));
  CHECK(fake.live_maps == 0);

  for (auto [r, d] : {std::pair<uint64_t, uint64_t>{0, 4},
                      {4, 64},
                      {0, 2 * kMiB},
                      {0, 2 * kMiB - 4}}) {
    s = session.SetDoorbell(FakeCuda::Uuid(0xa0),
                            UniqueFd(fake.ExportAllocation(2 * kMiB)), 2 * kMiB,
                            r, d);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  }
  CHECK(fake.live_maps == 0);
  CHECK(SetBell(fake, session, 0x77).code() == absl::StatusCode::kNotFound);

  REQUIRE(SetBell(fake, session).ok());
  fake.FailNext("cuStreamWaitValue64", cu::CUDA_ERROR_INVALID_VALUE);
  s = session.Launch(0, run, 2, &signalled);
  CHECK_FALSE(s.ok());
  CHECK_FALSE(ran);
  CHECK_FALSE(signalled);  // the client must not wait for done
}

TEST_CASE("Closing a session releases the doorbell mapping",
          "[cuda_session][doorbell]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  {
    CudaSession session(devices.get(), NoGrace());
    REQUIRE(SetBell(fake, session).ok());
    REQUIRE(session
                .Launch(
                    0, [](const CallOptions&) { return absl::OkStatus(); }, 1)
                .ok());
    fake.CompleteAll();  // the client rang: the wait passed
    fake.memops.clear();
  }
  CHECK(fake.memops.empty());  // nothing had to be released by force
  CHECK(fake.live_maps == 0);
  CHECK(fake.live_reservations == 0);
  CHECK(fake.live_handles == 0);
  CHECK(fake.live_streams == 0);
  CHECK(fake.live_events == 0);
  CHECK(FakeCuda::PushedDepth() == 0);
}

TEST_CASE("Session close releases a doorbell wait the client never rang",
          "[cuda_session][doorbell]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  uint64_t ready = 0;
  {
    CudaSessionOptions options;
    options.doorbell_grace = std::chrono::milliseconds(0);
    CudaSession session(devices.get(), options);
    REQUIRE(SetBell(fake, session).ok());
    ready = fake.maps_.begin()->first + kReadyOff;
    REQUIRE(session
                .Launch(
                    0, [](const CallOptions&) { return absl::OkStatus(); }, 1)
                .ok());
    fake.memops.clear();  // the GPU has not passed the wait
  }
  REQUIRE(fake.memops.size() == 1);
  CHECK(fake.memops[0].write);
  CHECK(fake.memops[0].addr == ready);
  // Releases the GEQ wait for sequence 1, which compares cyclically:
  // UINT64_MAX would read as -1 and release nothing.
  CHECK(static_cast<int64_t>(fake.memops[0].value - 1) >= 0);
  CHECK(fake.memops[0].value != UINT64_MAX);
  CHECK(fake.live_maps == 0);
  CHECK(fake.live_streams == 0);
}

TEST_CASE("A session's stream is watched for sticky errors while it lives",
          "[cuda_session]") {
  FakeCuda fake;
  auto devices = CudaDevices::Open(fake.driver(), "");
  auto queries = [&] {
    fake.calls.clear();
    REQUIRE(devices->PollSticky().ok());
    int n = 0;
    for (const std::string& c : fake.calls) n += c == "cuStreamQuery";
    return n;
  };
  CHECK(queries() == 1);  // the probe stream only
  {
    CudaSession session(devices.get());
    REQUIRE(
        session.Launch(0, [](const CallOptions&) { return absl::OkStatus(); })
            .ok());
    CHECK(queries() == 2);  // and the session's stream
  }
  CHECK(queries() == 1);  // unwatched before it was destroyed
}

}  // namespace
}  // namespace kreg
