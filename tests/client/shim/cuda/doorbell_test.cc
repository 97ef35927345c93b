// The client's doorbell over the fake CUDA driver: memops support check,
// the words it rings and waits on, cross-stream ordering, release.
#include "client/shim/cuda/doorbell.h"

#include <algorithm>
#include <memory>

#include "catch2/catch.hpp"
#include "tests/testing/fake_cuda.h"

namespace kreg::cuda_client {
namespace {

using ::kreg::testing::FakeCuda;

cu::CUcontext Ctx() {
  return reinterpret_cast<cu::CUcontext>(static_cast<uintptr_t>(0x1000));
}

struct Pushed {
  explicit Pushed(const cu::CudaDriver* d) : d(d) {
    d->cuCtxPushCurrent(Ctx());
  }
  ~Pushed() {
    cu::CUcontext c;
    d->cuCtxPopCurrent(&c);
  }
  const cu::CudaDriver* d;
};

cu::CUstream Stream(uintptr_t n) { return reinterpret_cast<cu::CUstream>(n); }

TEST_CASE("A doorbell rings ready and waits for done with sequence numbers",
          "[doorbell]") {
  FakeCuda fake;
  Pushed pushed(fake.driver());
  {
    std::unique_ptr<Doorbell> bell;
    ClientStatus s = Doorbell::Create(fake.driver(), 0, Ctx(), &bell);
    INFO(s.message);
    REQUIRE(s.ok());
    CHECK(bell->size() == fake.granularity);
    CHECK(bell->done() - bell->ready() == Doorbell::kDoneOffset);
    UniqueFd fd;
    REQUIRE(bell->Export(&fd).ok());
    CHECK(fd.ok());

    const cu::CUstream a = Stream(0xa000), b = Stream(0xb000);
    uint64_t seq = bell->NextSeq();
    CHECK(seq == 1);
    REQUIRE(bell->Ring(a, seq).ok());
    REQUIRE(bell->AwaitDone(a, seq).ok());
    REQUIRE(bell->Finish(a).ok());
    REQUIRE(fake.memops.size() == 2);
    CHECK(fake.memops[0].write);
    CHECK(fake.memops[0].stream == a);
    CHECK(fake.memops[0].addr == bell->ready());
    CHECK(fake.memops[0].value == 1);
    CHECK_FALSE(fake.memops[1].write);
    CHECK(fake.memops[1].addr == bell->done());
    CHECK(fake.memops[1].value == 1);

    // Same stream: no extra ordering. Another stream: it first waits for
    // the previous launch's last use, so `ready` never goes down.
    fake.calls.clear();
    seq = bell->NextSeq();
    REQUIRE(bell->Ring(a, seq).ok());
    REQUIRE(bell->Finish(a).ok());  // kregd did not signal: no wait
    CHECK(std::count(fake.calls.begin(), fake.calls.end(),
                     "cuStreamWaitEvent") == 0);
    CHECK(std::count(fake.calls.begin(), fake.calls.end(),
                     "cuStreamWaitValue64") == 0);
    seq = bell->NextSeq();
    CHECK(seq == 3);
    REQUIRE(bell->Ring(b, seq).ok());
    CHECK(std::count(fake.calls.begin(), fake.calls.end(),
                     "cuStreamWaitEvent") == 1);
    REQUIRE(bell->AwaitDone(b, seq).ok());
    REQUIRE(bell->Finish(b).ok());
    CHECK(fake.memops.back().stream == b);
    CHECK(fake.memops.back().value == 3);
    fake.CompleteAll();  // kregd wrote done: the last use has passed
    fake.memops.clear();
  }
  CHECK(fake.memops.empty());  // nothing forced
  CHECK(fake.live_maps == 0);
  CHECK(fake.live_handles == 0);
  CHECK(fake.live_reservations == 0);
  CHECK(fake.live_events == 0);
}

TEST_CASE("A device without 64-bit stream memops gets no doorbell",
          "[doorbell]") {
  FakeCuda fake;
  fake.devices[0].memops64 = false;
  Pushed pushed(fake.driver());
  std::unique_ptr<Doorbell> bell;
  ClientStatus s = Doorbell::Create(fake.driver(), 0, Ctx(), &bell);
  CHECK(s.code == kFailedPrecondition);
  CHECK(bell == nullptr);
  CHECK(fake.live_handles == 0);
  CHECK(Doorbell::Create(nullptr, 0, Ctx(), &bell).code == kUnavailable);
}

TEST_CASE("Abandon releases a wait whose done never came and says so",
          "[doorbell]") {
  FakeCuda fake;
  Pushed pushed(fake.driver());
  std::unique_ptr<Doorbell> bell;
  REQUIRE(Doorbell::Create(fake.driver(), 0, Ctx(), &bell).ok());
  CHECK_FALSE(bell->Abandon());  // no launch yet: nothing to release
  CHECK(fake.memops.empty());
  const cu::CUstream a = Stream(0xa000);
  uint64_t seq = bell->NextSeq();
  REQUIRE(bell->Ring(a, seq).ok());
  REQUIRE(bell->AwaitDone(a, seq).ok());
  REQUIRE(bell->Finish(a).ok());
  fake.memops.clear();
  CHECK(bell->Pending());               // XLA's stream has not passed the wait
  CHECK(FakeCuda::PushedDepth() == 1);  // its context pushed and popped
  // The executor died before its stream wrote done := 1: the error is
  // recorded before the wait is released.
  size_t writes_before_callback = 99;
  CHECK(bell->Abandon([&] { writes_before_callback = fake.memops.size(); }));
  CHECK(writes_before_callback == 0);
  REQUIRE(fake.memops.size() == 1);
  CHECK(fake.memops[0].write);
  CHECK(fake.memops[0].addr == bell->done());
  // Releases the cyclic GEQ wait for `seq` (UINT64_MAX would not).
  CHECK(static_cast<int64_t>(fake.memops[0].value - seq) >= 0);
  CHECK(fake.memops[0].stream != a);  // a private stream, not XLA's
  CHECK(fake.live_streams == 0);
  fake.CompleteAll();
  CHECK_FALSE(bell->Pending());
  bell.reset();
  CHECK(fake.live_maps == 0);
}

TEST_CASE(
    "Abandon writes done from a context of its own when the driver can make "
    "one (not behind XLA's blocked stream)",
    "[doorbell]") {
  FakeCuda fake;
  fake.EnableCtxCreate();
  Pushed pushed(fake.driver());
  std::unique_ptr<Doorbell> bell;
  REQUIRE(Doorbell::Create(fake.driver(), 0, Ctx(), &bell).ok());
  const cu::CUstream a = Stream(0xa000);
  uint64_t seq = bell->NextSeq();
  REQUIRE(bell->Ring(a, seq).ok());
  REQUIRE(bell->AwaitDone(a, seq).ok());
  REQUIRE(bell->Finish(a).ok());
  fake.memops.clear();
  const int depth = FakeCuda::PushedDepth();
  CHECK(bell->Abandon());
  REQUIRE(fake.memops.size() == 1);
  // Releases the cyclic GEQ wait for `seq` (UINT64_MAX would not).
  CHECK(static_cast<int64_t>(fake.memops[0].value - seq) >= 0);
  CHECK(fake.memops[0].context != nullptr);
  CHECK(fake.memops[0].context != Ctx());  // not the doorbell's context
  CHECK(fake.contexts_created == 1);
  CHECK(fake.contexts_live == 0);  // destroyed again
  CHECK(FakeCuda::PushedDepth() == depth);
  CHECK(fake.live_streams == 0);
}

TEST_CASE("ReleaseValue satisfies every cyclic GEQ wait up to the last seq",
          "[doorbell]") {
  for (uint64_t last : {uint64_t{1}, uint64_t{1000}, uint64_t{1} << 40}) {
    const uint64_t v = cu::ReleaseValue(last);
    for (uint64_t seq : {uint64_t{1}, last / 2 + 1, last}) {
      CHECK(static_cast<int64_t>(v - seq) >= 0);
    }
  }
  // What the old code wrote releases nothing: (int64_t)(UINT64_MAX - 1) < 0.
  CHECK(static_cast<int64_t>(UINT64_MAX - 1) < 0);
}

TEST_CASE("Abandon leaves a doorbell whose done was written alone",
          "[doorbell]") {
  FakeCuda fake;
  Pushed pushed(fake.driver());
  std::unique_ptr<Doorbell> bell;
  REQUIRE(Doorbell::Create(fake.driver(), 0, Ctx(), &bell).ok());
  const cu::CUstream a = Stream(0xa000);
  for (int i = 0; i < 2; ++i) {
    uint64_t seq = bell->NextSeq();
    REQUIRE(bell->Ring(a, seq).ok());
    REQUIRE(bell->AwaitDone(a, seq).ok());
    REQUIRE(bell->Finish(a).ok());
  }
  // The executor wrote done := 2 (the last launch) before it went away.
  fake.memory_[bell->done()] = 2;
  fake.CompleteAll();
  fake.memops.clear();
  bool called = false;
  CHECK_FALSE(bell->Abandon([&] { called = true; }));
  CHECK_FALSE(called);
  CHECK(fake.memops.empty());  // nothing forced
  // done := 1 only (the last launch's write never came): lost.
  fake.memory_[bell->done()] = 1;
  CHECK(bell->Abandon());
  CHECK(fake.memops.size() == 1);
}

TEST_CASE("Abandon does not count a launch nobody waits for as lost",
          "[doorbell]") {
  FakeCuda fake;
  Pushed pushed(fake.driver());
  std::unique_ptr<Doorbell> bell;
  REQUIRE(Doorbell::Create(fake.driver(), 0, Ctx(), &bell).ok());
  const cu::CUstream a = Stream(0xa000);
  uint64_t seq = bell->NextSeq();
  REQUIRE(bell->Ring(a, seq).ok());
  REQUIRE(bell->AwaitDone(a, seq).ok());
  REQUIRE(bell->Finish(a).ok());
  fake.memory_[bell->done()] = 1;  // launch 1 completed
  // Launch 2 failed in the executor (no done write, so no wait queued):
  // the call itself reported that; nothing on XLA's stream waits for it.
  seq = bell->NextSeq();
  REQUIRE(bell->Ring(a, seq).ok());
  REQUIRE(bell->Finish(a).ok());
  fake.CompleteAll();
  fake.memops.clear();
  CHECK_FALSE(bell->Abandon());
  CHECK(fake.memops.empty());
}

}  // namespace
}  // namespace kreg::cuda_client
