// The staging path of the shim (buffers kregd cannot map, e.g.
// XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async) over the fake driver: the layout of
// a call's staged buffers (zero-size ones, several, aliased pairs) and the
// staging arena's stream ordering (a buffer outgrown is freed only once its
// last use has completed; a call on another stream waits for the last one).
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "client/shim/cuda/cuda_export.h"
#include "client/shim/cuda/staging_buffer.h"
#include "tests/testing/fake_cuda.h"

namespace kreg::cuda_client {
namespace {

using testing::FakeCuda;

constexpr uint64_t kMiB = 1 << 20;

const void* Ptr(uint64_t address) {
  return reinterpret_cast<const void*>(static_cast<uintptr_t>(address));
}

int Count(const std::vector<std::string>& calls, const std::string& fn) {
  int n = 0;
  for (const std::string& c : calls) n += c == fn;
  return n;
}

// Pushes the fake device's context for the scope (like PushContext).
struct Current {
  explicit Current(FakeCuda& fake) : d(fake.driver()) {
    REQUIRE(StreamDevice(d, reinterpret_cast<cu::CUstream>(0x2001), &ctx,
                         nullptr, nullptr)
                .ok());
    REQUIRE(d->cuCtxPushCurrent(ctx) == cu::CUDA_SUCCESS);
  }
  ~Current() {
    cu::CUcontext popped;
    d->cuCtxPopCurrent(&popped);
  }
  const cu::CudaDriver* d;
  cu::CUcontext ctx = nullptr;
};

TEST_CASE("Zero-size staged buffers get no region and no copy", "[staging]") {
  // AddMul on shape (0,): every buffer empty (XLA may give null or one
  // shared pointer for all of them).
  std::vector<StagedBuffer> b = {{nullptr, 0, true},
                                 {nullptr, 0, true},
                                 {Ptr(0x1000), 0, false},
                                 {Ptr(0x1000), 0, false}};
  StagingLayout l;
  REQUIRE(LayoutStaging(b, 256, &l).ok());
  CHECK(l.bytes == 0);
  for (size_t i = 0; i < b.size(); ++i) {
    CHECK_FALSE(l.copy_in[i]);
    CHECK_FALSE(l.copy_out[i]);
  }
  // Mixed with non-empty ones, the empty ones take no room.
  b = {{Ptr(0x1000), 0, true},
       {Ptr(0x2000), 4, true},
       {nullptr, 0, false},
       {Ptr(0x3000), 4, false}};
  REQUIRE(LayoutStaging(b, 256, &l).ok());
  CHECK(l.bytes == 512);
  CHECK(l.offsets[1] == 0);
  CHECK(l.offsets[3] == 256);
  CHECK(l.copy_in == std::vector<bool>{false, true, false, false});
  CHECK(l.copy_out == std::vector<bool>{false, false, false, true});
}

TEST_CASE("Several staged buffers get disjoint aligned regions", "[staging]") {
  // AddMul on a 0-d shape and on (3,4,2): two inputs, two outputs.
  for (uint64_t bytes : {4ull, 96ull, 257ull}) {
    std::vector<StagedBuffer> b = {{Ptr(0x10000), bytes, true},
                                   {Ptr(0x20000), bytes, true},
                                   {Ptr(0x30000), bytes, false},
                                   {Ptr(0x40000), bytes, false}};
    StagingLayout l;
    REQUIRE(LayoutStaging(b, 256, &l).ok());
    const uint64_t region = (bytes + 255) / 256 * 256;
    CHECK(l.bytes == 4 * region);
    for (size_t i = 0; i < b.size(); ++i) {
      CHECK(l.offsets[i] % 256 == 0);
      CHECK(l.offsets[i] + bytes <= l.bytes);
      for (size_t j = 0; j < i; ++j) {
        CHECK((l.offsets[j] + bytes <= l.offsets[i] ||
               l.offsets[i] + bytes <= l.offsets[j]));
      }
    }
    CHECK(l.copy_in == std::vector<bool>{true, true, false, false});
    CHECK(l.copy_out == std::vector<bool>{false, false, true, true});
  }
}

TEST_CASE("An aliased pair shares a region, copied in and out once",
          "[staging]") {
  std::vector<StagedBuffer> b = {{Ptr(0x10000), 64, true},   // state
                                 {Ptr(0x20000), 16, true},   // idx
                                 {Ptr(0x10000), 64, true},   // state again
                                 {Ptr(0x10000), 64, false},  // aliased out
                                 {Ptr(0x10000), 64, false}};
  StagingLayout l;
  REQUIRE(LayoutStaging(b, 256, &l).ok());
  CHECK(l.bytes == 512);
  CHECK(l.offsets[0] == l.offsets[2]);
  CHECK(l.offsets[0] == l.offsets[3]);
  CHECK(l.offsets[0] == l.offsets[4]);
  CHECK(l.offsets[1] != l.offsets[0]);
  CHECK(l.copy_in == std::vector<bool>{true, true, false, false, false});
  CHECK(l.copy_out == std::vector<bool>{false, false, false, true, false});
}

TEST_CASE("Staged sizes that overflow are refused", "[staging]") {
  std::vector<StagedBuffer> b = {{Ptr(0x10000), UINT64_MAX - 8, true}};
  StagingLayout l;
  CHECK(LayoutStaging(b, 256, &l).code == kInvalidArgument);
  b = {{Ptr(0x10000), UINT64_MAX / 2 + 1, true},
       {Ptr(0x20000), UINT64_MAX / 2 + 1, true}};
  CHECK(LayoutStaging(b, 256, &l).code == kInvalidArgument);
}

TEST_CASE("An outgrown staging buffer is freed only after its last use",
          "[staging]") {
  FakeCuda fake;
  {
    Current cur(fake);
    auto stream = reinterpret_cast<cu::CUstream>(0x2001);
    StagingArena arena(fake.driver(), 0, cur.ctx);
    AllocationId retired;
    CHECK(arena.Acquire(stream, 0, &retired).code == kInvalidArgument);
    REQUIRE(arena.Acquire(stream, 1024, &retired).ok());
    CHECK(retired.size == 0);
    REQUIRE(arena.buffer() != nullptr);
    const uint64_t first_base = arena.buffer()->data();
    const AllocationId first = arena.id();
    CHECK(first.base == first_base);
    CHECK(first.size == arena.buffer()->size());
    // A call's copies in and out, then its end.
    fake.driver()->cuMemcpyDtoDAsync(first_base, 0x1, 1024, stream);
    REQUIRE(arena.Release(stream).ok());
    CHECK(fake.live_maps == 1);

    // A bigger call while the first one's copies are still queued: a new
    // buffer, the old one kept (no host wait, no unmap under the copy).
    const int syncs = fake.stream_syncs;
    REQUIRE(arena.Acquire(stream, 5 * kMiB, &retired).ok());
    CHECK(retired.base == first.base);
    CHECK(retired.generation == first.generation);
    CHECK(arena.buffer()->size() >= 5 * kMiB);
    CHECK(arena.id().base != first.base);
    CHECK(fake.live_maps == 2);
    CHECK(arena.retired_count() == 1);
    CHECK(fake.stream_syncs == syncs);
    CHECK(Count(fake.calls, "cuEventSynchronize") == 0);
    arena.Reap();
    CHECK(fake.live_maps == 2);  // still queued

    fake.driver()->cuMemcpyDtoDAsync(arena.buffer()->data(), 0x1, 64, stream);
    REQUIRE(arena.Release(stream).ok());
    fake.CompleteAll();
    arena.Reap();
    CHECK(arena.retired_count() == 0);
    CHECK(fake.live_maps == 1);  // the old one is gone now

    // Growth again, then the arena destroyed with work queued: it waits.
    REQUIRE(arena.Acquire(stream, 64 * kMiB, &retired).ok());
    fake.driver()->cuMemcpyDtoDAsync(arena.buffer()->data(), 0x1, 64, stream);
    REQUIRE(arena.Release(stream).ok());
    CHECK(fake.live_maps == 2);
  }
  CHECK(fake.live_maps == 0);
  CHECK(fake.live_reservations == 0);
  CHECK(fake.live_events == 0);
  CHECK(FakeCuda::PushedDepth() == 0);
}

TEST_CASE("A staged call on another stream waits for the previous one",
          "[staging]") {
  FakeCuda fake;
  Current cur(fake);
  auto a = reinterpret_cast<cu::CUstream>(0x2001);
  auto b = reinterpret_cast<cu::CUstream>(0x2002);
  StagingArena arena(fake.driver(), 0, cur.ctx);
  REQUIRE(arena.Acquire(a, 4096, nullptr).ok());
  REQUIRE(arena.Release(a).ok());
  CHECK(Count(fake.calls, "cuStreamWaitEvent") == 0);
  REQUIRE(arena.Acquire(a, 4096, nullptr).ok());  // same stream: in order
  CHECK(Count(fake.calls, "cuStreamWaitEvent") == 0);
  REQUIRE(arena.Release(a).ok());
  REQUIRE(arena.Acquire(b, 4096, nullptr).ok());
  CHECK(Count(fake.calls, "cuStreamWaitEvent") == 1);
  REQUIRE(arena.Release(b).ok());

  // A failed record: the next call waits for the whole stream instead.
  fake.FailNext("cuEventRecord", cu::CUDA_ERROR_INVALID_HANDLE);
  CHECK_FALSE(arena.Release(b).ok());
  const int syncs = fake.stream_syncs;
  REQUIRE(arena.Acquire(a, 4096, nullptr).ok());
  CHECK(fake.stream_syncs == syncs + 1);
}

TEST_CASE("A staging buffer that cannot be created is an error", "[staging]") {
  FakeCuda fake;
  Current cur(fake);
  StagingArena arena(fake.driver(), 0, cur.ctx);
  fake.FailNext("cuMemCreate", cu::CUDA_ERROR_OUT_OF_MEMORY);
  fake.FailNext("cuMemCreate", cu::CUDA_ERROR_OUT_OF_MEMORY);
  ClientStatus s =
      arena.Acquire(reinterpret_cast<cu::CUstream>(0x2001), 4096, nullptr);
  CHECK(s.code == kResourceExhausted);
  CHECK(s.message.find("staging buffer") != std::string::npos);
  CHECK(arena.buffer() == nullptr);
  CHECK(fake.live_maps == 0);
}

}  // namespace
}  // namespace kreg::cuda_client
