// Session's CUDA launch path over the fake CUDA driver: device matched by
// UUID, VMM shares by fd, buffers resolved inside kregd's mappings (an
// aliased pair is one pointer), the "mapping missing" marker, and the
// errors a client sees.
#include <string.h>
#include <sys/mman.h>

#include <string>
#include <utility>
#include <vector>

#include "catch2/catch.hpp"
#include "common/ring_layout.h"
#include "daemon/executor/cuda/cuda_devices.h"
#include "daemon/executor/cuda/cuda_session.h"
#include "daemon/executor/session.h"
#include "tests/daemon/executor/test_util.h"
#include "tests/testing/fake_cuda.h"
#include "tests/testing/launch_spec.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace {

using ::kreg::testing::BufferSpec;
using ::kreg::testing::FakeCuda;
using ::kreg::testing::LaunchSpec;

class Backend : public SessionBackend {
 public:
  absl::StatusOr<ResolvedHandler> Lookup(const TargetKey& key,
                                         uint32_t) override {
    if (key.name != "t" || key.platform != Platform::kCuda) {
      return absl::NotFoundError("not registered");
    }
    return ResolvedHandler{reinterpret_cast<void*>(0x1)};
  }
  absl::Status Execute(void*, const LaunchFrame&) override {
    return absl::InternalError("Execute without options");
  }
  absl::Status ExecuteWith(void*, const LaunchFrame& frame,
                           const CallOptions& options) override {
    ++calls;
    last = frame;
    stream = options.stream;
    return absl::OkStatus();
  }
  uint32_t ffi_api_major() const override { return 0; }
  uint32_t ffi_api_minor() const override { return 4; }
  int calls = 0;
  LaunchFrame last;
  void* stream = nullptr;
};

constexpr uint64_t kClientBase = 0x7e0000000000ull;
constexpr uint64_t kSize = 4 << 20;

v1::CudaMappingRef Ref(const std::string& uuid, uint64_t gen = 9) {
  v1::CudaMappingRef r;
  r.set_device_uuid(uuid);
  r.set_base(kClientBase);
  r.set_size(kSize);
  r.set_generation(gen);
  return r;
}

LaunchSpec Spec(const std::string& uuid) {
  LaunchSpec l;
  l.set_target_name("t");
  l.set_platform("cuda");
  l.set_device_uuid(uuid);
  for (int i = 0; i < 2; ++i) {  // arg 0 and ret 0: one aliased region
    BufferSpec* b = i == 0 ? l.add_args() : l.add_rets();
    b->set_dtype(XLA_FFI_DataType_F32);
    b->add_dims(256);
    b->set_size(1024);
    b->set_offset(8192);
    *b->mutable_cuda() = Ref(uuid);
  }
  BufferSpec* empty = l.add_args();
  empty->set_dtype(XLA_FFI_DataType_F32);
  empty->add_dims(0);
  return l;
}

// `l` as a socket Launch, sharing its allocation (one VMM fd) if `share`.
v1::SessionRequest Launch(const LaunchSpec& l, bool share) {
  v1::SessionRequest req = ::kreg::testing::LaunchRequest(l, 3);
  if (share) {
    v1::CudaShare* s = req.mutable_launch()->add_shares();
    *s->mutable_mapping() = Ref(l.device_uuid());
    s->set_vmm_fd(true);
  }
  return req;
}

v1::SessionRequest Launch(const std::string& uuid, bool share) {
  return Launch(Spec(uuid), share);
}

struct Fixture {
  Fixture()
      : devices(CudaDevices::Open(fake.driver(), "")),
        session(1, UniqueFd(), PeerCred{1, 2, 3}, SessionLimits(), &backend,
                &counters, devices.get()) {
    v1::SessionRequest r;
    r.mutable_hello()->set_protocol_major(kSessionProtocolMajor);
    hello = session.Handle(r, {});
  }
  FakeCuda fake;
  std::unique_ptr<CudaDevices> devices;
  Backend backend;
  SessionCounters counters;
  Session session;
  v1::SessionResponse hello;
};

TEST_CASE("Hello announces kregd's GPUs and the mapping limit",
          "[cuda_launch]") {
  Fixture fx;
  REQUIRE(fx.hello.status().code() == 0);
  CHECK(fx.hello.hello().max_cuda_mappings() > 0);
  REQUIRE(fx.hello.hello().cuda_device_uuids_size() == fx.devices->count());
  CHECK(fx.hello.hello().cuda_device_uuids(0) ==
        std::string(fx.devices->info(0).uuid.bytes, 16));
}

TEST_CASE("A shared VMM allocation resolves inside kregd's mapping",
          "[cuda_launch]") {
  Fixture fx;
  const std::string uuid(fx.devices->info(0).uuid.bytes, 16);
  std::vector<UniqueFd> fds;
  fds.emplace_back(fx.fake.ExportAllocation(kSize));
  v1::SessionResponse resp =
      fx.session.Handle(Launch(uuid, true), std::move(fds));
  INFO(resp.status().message());
  REQUIRE(resp.status().code() == 0);
  REQUIRE(fx.backend.calls == 1);
  const LaunchFrame& f = fx.backend.last;
  CHECK(f.platform == Platform::kCuda);
  CHECK(f.device_ordinal == 0);
  CHECK(f.args[0].data != nullptr);
  CHECK(f.args[0].data == f.rets[0].data);  // the aliased pair: one buffer
  CHECK(reinterpret_cast<uint64_t>(f.args[0].data) != kClientBase + 8192);
  CHECK(f.args[1].data == nullptr);  // zero-size
  CHECK(fx.backend.stream != nullptr);

  // Cached: the next launch sends only the refs.
  resp = fx.session.Handle(Launch(uuid, false), {});
  CHECK(resp.status().code() == 0);
  CHECK(fx.backend.calls == 2);
  CHECK(fx.fake.live_maps == 1);

  // A new generation at the same address is another allocation: missing.
  LaunchSpec renewed = Spec(uuid);
  *renewed.mutable_args(0)->mutable_cuda() = Ref(uuid, 10);
  v1::SessionRequest req = Launch(renewed, false);
  resp = fx.session.Handle(req, {});
  CHECK(resp.status().code() == int(absl::StatusCode::kNotFound));
  CHECK(resp.launch().cuda_mapping_missing());
  CHECK(fx.backend.calls == 2);

  // A released allocation is dropped.
  req = Launch(uuid, false);
  *req.mutable_launch()->add_release() = Ref(uuid);
  resp = fx.session.Handle(req, {});
  CHECK(resp.launch().cuda_mapping_missing());
}

TEST_CASE("A buffer past its allocation is refused", "[cuda_launch]") {
  Fixture fx;
  const std::string uuid(fx.devices->info(0).uuid.bytes, 16);
  LaunchSpec l = Spec(uuid);
  l.mutable_args(0)->set_offset(kSize - 512);
  v1::SessionRequest req = Launch(l, true);
  std::vector<UniqueFd> fds;
  fds.emplace_back(fx.fake.ExportAllocation(kSize));
  v1::SessionResponse resp = fx.session.Handle(req, std::move(fds));
  CHECK(resp.status().code() == int(absl::StatusCode::kOutOfRange));
  CHECK(fx.backend.calls == 0);
}

TEST_CASE("A client GPU kregd does not see gets a clear error",
          "[cuda_launch]") {
  Fixture fx;
  const std::string other = FakeCuda::Uuid(0x55);
  v1::SessionResponse resp = fx.session.Handle(Launch(other, false), {});
  CHECK(resp.status().code() == int(absl::StatusCode::kNotFound));
  CHECK_FALSE(resp.launch().cuda_mapping_missing());
  CHECK(resp.status().message().rfind(
            "the client's GPU cannot be used by kregd: CUDA device GPU-5555",
            0) == 0);
  CHECK(resp.status().message().find("is not visible to kregd") !=
        std::string::npos);
}

TEST_CASE("An executor whose devices did not open says why at hello and launch",
          "[cuda_launch]") {
  // What exec_main passes when CudaDevices::OpenSystem failed (e.g. the
  // device's memory was full): the reason reaches the client.
  std::unique_ptr<CudaDevices> none =
      CudaDevices::Open(nullptr, "no CUDA driver: test reason");
  REQUIRE_FALSE(none->status().ok());
  Backend backend;
  SessionCounters counters;
  Session session(1, UniqueFd(), PeerCred{1, 2, 3}, SessionLimits(), &backend,
                  &counters, none.get());
  v1::SessionRequest r;
  r.mutable_hello()->set_protocol_major(kSessionProtocolMajor);
  v1::SessionResponse hello = session.Handle(r, {});
  REQUIRE(hello.status().code() == 0);
  CHECK(hello.hello().cuda_device_uuids_size() == 0);
  CHECK(hello.hello().cuda_status() == std::string(none->status().message()));
  v1::SessionResponse resp =
      session.Handle(Launch(FakeCuda::Uuid(0x11), false), {});
  CHECK(resp.status().code() == int(absl::StatusCode::kUnimplemented));
  CHECK(resp.status().message().find(
            "this kregd serves no CUDA device (no CUDA driver: test reason") !=
        std::string::npos);
}

TEST_CASE("A VMM share without its fd is refused", "[cuda_launch]") {
  Fixture fx;
  const std::string uuid(fx.devices->info(0).uuid.bytes, 16);
  v1::SessionResponse resp = fx.session.Handle(Launch(uuid, true), {});
  CHECK(resp.status().code() == int(absl::StatusCode::kInvalidArgument));
  CHECK(resp.status().message().find("expects a VMM fd") != std::string::npos);
}

// --- Steady-state launches on the launch ring (ring layout version 2) -----

// The client's side of the ring, against ring_layout.h only.
struct RingClient {
  RingClient() {
    fd = ::kreg::testing::MakeMemfd(ring::kRegionBytes);
    void* p = ::mmap(nullptr, ring::kRegionBytes, PROT_READ | PROT_WRITE,
                     MAP_SHARED, fd.get(), 0);
    REQUIRE(p != MAP_FAILED);
    base = static_cast<char*>(p);
  }
  ~RingClient() { ::munmap(base, ring::kRegionBytes); }
  ring::Control* c() { return ring::ControlOf(base); }
  void Submit(const LaunchSpec& l, uint64_t tag, uint32_t flags = 0) {
    const std::string bytes = ::kreg::testing::EncodeSpec(l, tail, tag, flags);
    REQUIRE(bytes.size() <= ring::kSubmitSlotBytes);
    memcpy(ring::SubmitSlot(base, tail), bytes.data(), bytes.size());
    ++tail;
    ring::Store(c()->sq_tail, tail);
    if (ring::Load(c()->sq_waiting) != 0) ring::FutexWake(&c()->sq_tail);
  }
  // Waits up to 10 s for the next completion.
  bool Await(ring::CompletionHeader* h, std::string* message) {
    int64_t deadline = ring::NowNs() + 10'000'000'000;
    ring::SpinPolicy spin(10'000);
    while (ring::Load(c()->cq_tail) == head) {
      if (ring::NowNs() > deadline) return false;
      ring::SpinThenWait(&c()->cq_tail, head, &c()->cq_waiting, &spin,
                         10'000'000);
    }
    const char* slot = ring::CompleteSlot(base, head);
    memcpy(h, slot, sizeof(*h));
    message->assign(slot + sizeof(*h), h->message_len);
    ++head;
    ring::Store(c()->cq_head, head);
    return true;
  }
  UniqueFd fd;
  char* base;
  uint32_t tail = 0, head = 0;
};

struct RingFixture : Fixture {
  RingFixture() {
    uuid.assign(devices->info(0).uuid.bytes, 16);
    v1::SessionRequest bell;
    bell.set_id(4);
    v1::CudaDoorbellSetup* b = bell.mutable_cuda_doorbell();
    b->set_device_uuid(uuid);
    b->set_size(2 << 20);
    b->set_ready_offset(0);
    b->set_done_offset(128);
    std::vector<UniqueFd> fds;
    fds.emplace_back(fake.ExportAllocation(2 << 20));
    v1::SessionResponse r = session.Handle(bell, std::move(fds));
    INFO(r.status().message());
    REQUIRE(r.status().code() == 0);
    // The first launch shares the allocation on the socket.
    fds.clear();
    fds.emplace_back(fake.ExportAllocation(kSize));
    r = session.Handle(Launch(Steady(1), true), std::move(fds));
    INFO(r.status().message());
    REQUIRE(r.status().code() == 0);
    REQUIRE(r.launch().doorbell_signalled());
    v1::SessionRequest setup;
    setup.set_id(5);
    setup.mutable_ring_setup()->set_size(ring::kRegionBytes);
    setup.mutable_ring_setup()->set_version(ring::kVersion);
    fds.clear();
    fds.emplace_back(::dup(client.fd.get()));
    r = session.Handle(setup, std::move(fds));
    INFO(r.status().message());
    REQUIRE(r.status().code() == 0);
  }
  // A steady-state launch: the socket launch's buffers, no shares.
  LaunchSpec Steady(uint64_t seq) {
    LaunchSpec l = Spec(uuid);
    l.set_doorbell_seq(seq);
    return l;
  }
  // done := seq writes enqueued so far.
  std::vector<uint64_t> DoneWrites() {
    std::vector<uint64_t> out;
    for (const FakeCuda::MemOp& m : fake.memops) {
      if (m.write && m.value != 0) out.push_back(m.value);
    }
    return out;
  }
  std::string uuid;
  RingClient client;
};

TEST_CASE("A steady-state CUDA launch runs from the ring and rings done",
          "[cuda_launch][ring]") {
  RingFixture fx;
  REQUIRE(fx.backend.calls == 1);
  const void* shared = fx.backend.last.args[0].data;
  for (uint64_t seq = 2; seq < 2 + 3 * ring::kSlots; ++seq) {
    fx.client.Submit(fx.Steady(seq), 100 + seq);
    ring::CompletionHeader h;
    std::string msg;
    REQUIRE(fx.client.Await(&h, &msg));
    INFO(msg);
    CHECK(h.code == 0);
    CHECK(h.tag == 100 + seq);
    CHECK(h.flags == ring::kDoneSignalled);
  }
  CHECK(fx.backend.calls == 1 + 3 * int(ring::kSlots));
  // The same mapping as the socket launch: one buffer for the aliased pair.
  CHECK(fx.backend.last.args[0].data == shared);
  CHECK(fx.backend.last.rets[0].data == shared);
  CHECK(fx.backend.last.args[1].data == nullptr);
  CHECK(fx.backend.last.device_ordinal == 0);
  CHECK(fx.fake.live_maps == 2);  // the allocation and the doorbell
  const std::vector<uint64_t> done = fx.DoneWrites();
  REQUIRE(done.size() == 1 + 3 * ring::kSlots);
  for (size_t i = 0; i < done.size(); ++i) CHECK(done[i] == i + 1);
}

TEST_CASE(
    "Failed ring CUDA launches still ring done; what kregd cannot "
    "resolve says so",
    "[cuda_launch][ring]") {
  RingFixture fx;
  ring::CompletionHeader h;
  std::string msg;
  // An allocation the session does not hold: mapping missing, signalled.
  LaunchSpec l = fx.Steady(2);
  *l.mutable_args(0)->mutable_cuda() = Ref(fx.uuid, 10);
  fx.client.Submit(l, 2, ring::kSubmitAsync);
  REQUIRE(fx.client.Await(&h, &msg));
  CHECK(h.code == int(absl::StatusCode::kNotFound));
  CHECK(msg.find("arg 0: allocation 0x7e0000000000 (+4194304 bytes, "
                 "generation 10) on GPU-") == 0);
  CHECK(h.flags == (ring::kDoneSignalled | ring::kMappingMissing));
  // Past the allocation: the mapping's error, signalled.
  l = fx.Steady(3);
  l.mutable_rets(0)->set_offset(kSize - 512);
  fx.client.Submit(l, 3);
  REQUIRE(fx.client.Await(&h, &msg));
  CHECK(h.code == int(absl::StatusCode::kOutOfRange));
  CHECK(msg.find("ret 0: allocation 0x7e0000000000") == 0);
  CHECK(h.flags == ring::kDoneSignalled);
  // A bad shape: the decoder's message, signalled.
  l = fx.Steady(4);
  l.mutable_args(0)->set_size(20);
  fx.client.Submit(l, 4);
  REQUIRE(fx.client.Await(&h, &msg));
  CHECK(msg ==
        "arg 0: dims [256] of F32 need 1024 bytes but the buffer has 20");
  CHECK(h.flags == ring::kDoneSignalled);
  // A target the session cannot run: signalled.
  l = fx.Steady(5);
  l.set_target_name("u");
  fx.client.Submit(l, 5);
  REQUIRE(fx.client.Await(&h, &msg));
  CHECK(h.code == int(absl::StatusCode::kNotFound));
  CHECK(h.flags == ring::kDoneSignalled);
  CHECK(fx.backend.calls == 1);
  CHECK(fx.DoneWrites() == std::vector<uint64_t>{1, 2, 3, 4, 5});
  // A device that is not kregd's: nothing to signal on.
  l = fx.Steady(6);
  l.set_device_uuid(std::string(16, 'z'));
  for (int i = 0; i < 2; ++i) {
    (*l.mutable_args(0)->mutable_cuda()).set_device_uuid(std::string(16, 'z'));
  }
  fx.client.Submit(l, 6);
  REQUIRE(fx.client.Await(&h, &msg));
  CHECK(msg.find("the client's GPU cannot be used by kregd: ") == 0);
  CHECK(h.flags == 0);
  // And the ring still serves the session.
  fx.client.Submit(fx.Steady(7), 7);
  REQUIRE(fx.client.Await(&h, &msg));
  CHECK(h.code == 0);
  CHECK(fx.backend.calls == 2);
}

TEST_CASE(
    "A ring launch naming more allocations than kregd may hold is "
    "refused before any is resolved",
    "[cuda_launch][ring]") {
  RingFixture fx;
  const size_t limit = CudaSessionOptions{}.cache.max_entries;
  // The fixture shared one allocation; share limit - 1 more.
  v1::SessionRequest share;
  share.set_id(9);
  std::vector<UniqueFd> fds;
  for (size_t i = 1; i < limit; ++i) {
    v1::CudaShare* s = share.mutable_cuda_share()->add_shares();
    *s->mutable_mapping() = Ref(fx.uuid);
    s->mutable_mapping()->set_base(kClientBase + i * kSize);
    s->set_vmm_fd(true);
    fds.emplace_back(fx.fake.ExportAllocation(kSize));
  }
  v1::SessionResponse r = fx.session.Handle(share, std::move(fds));
  INFO(r.status().message());
  REQUIRE(r.status().code() == 0);
  auto with_args = [&](size_t n) {
    LaunchSpec l = fx.Steady(0);
    l.clear_args();
    l.clear_rets();
    for (size_t i = 0; i < n; ++i) {
      BufferSpec* b = l.add_args();
      b->set_dtype(XLA_FFI_DataType_F32);
      b->add_dims(4);
      b->set_size(16);
      *b->mutable_cuda() = Ref(fx.uuid);
      b->mutable_cuda()->set_base(kClientBase + i * kSize);
    }
    return l;
  };
  ring::CompletionHeader h;
  std::string msg;
  // Every allocation the session holds: runs.
  LaunchSpec all = with_args(limit);
  all.set_doorbell_seq(2);
  fx.client.Submit(all, 2);
  REQUIRE(fx.client.Await(&h, &msg));
  INFO(msg);
  CHECK(h.code == 0);
  CHECK(fx.backend.last.args.size() == limit);
  // One more: refused, and the doorbell still rung.
  LaunchSpec more = with_args(limit + 1);
  more.set_doorbell_seq(3);
  fx.client.Submit(more, 3);
  REQUIRE(fx.client.Await(&h, &msg));
  CHECK(h.code == int(absl::StatusCode::kResourceExhausted));
  CHECK(msg == "the launch references more than " + std::to_string(limit) +
                   " distinct GPU allocations (kregd's per-session limit)");
  CHECK(h.flags == ring::kDoneSignalled);
  CHECK(fx.backend.calls == 2);
}

}  // namespace
}  // namespace kreg
