// Session's CUDA launch path over the fake CUDA driver: device matched by
// UUID, VMM shares by fd, buffers resolved inside kregd's mappings (an
// aliased pair is one pointer), the "mapping missing" marker, and the
// errors a client sees.
#include <string>
#include <utility>
#include <vector>

#include "catch2/catch.hpp"
#include "daemon/cuda/cuda_devices.h"
#include "daemon/session/session.h"
#include "tests/daemon/cuda/fake_cuda.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace {

using ::kreg::testing::FakeCuda;

class Backend : public SessionBackend {
 public:
  absl::StatusOr<v1::RegisterReply> Register(const v1::RegisterRequest&,
                                             const PeerCred&) override {
    return absl::UnimplementedError("");
  }
  v1::ListReply List() override { return {}; }
  absl::StatusOr<void*> Lookup(const TargetKey& key) override {
    if (key.name != "t" || key.platform != Platform::kCuda) {
      return absl::NotFoundError("not registered");
    }
    return reinterpret_cast<void*>(0x1);
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

v1::SessionRequest Launch(const std::string& uuid, bool share) {
  v1::SessionRequest req;
  req.set_id(3);
  v1::Launch* l = req.mutable_launch();
  l->set_target_name("t");
  l->set_platform("cuda");
  l->set_device_uuid(uuid);
  for (int i = 0; i < 2; ++i) {  // arg 0 and ret 0: one aliased region
    v1::Buffer* b = i == 0 ? l->add_args() : l->add_rets();
    b->set_dtype(XLA_FFI_DataType_F32);
    b->add_dims(256);
    b->set_size(1024);
    b->set_offset(8192);
    *b->mutable_cuda() = Ref(uuid);
  }
  v1::Buffer* empty = l->add_args();
  empty->set_dtype(XLA_FFI_DataType_F32);
  empty->add_dims(0);
  if (share) {
    v1::CudaShare* s = l->add_shares();
    *s->mutable_mapping() = Ref(uuid);
    s->set_vmm_fd(true);
  }
  return req;
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
  v1::SessionRequest req = Launch(uuid, false);
  *req.mutable_launch()->mutable_args(0)->mutable_cuda() = Ref(uuid, 10);
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
  v1::SessionRequest req = Launch(uuid, true);
  req.mutable_launch()->mutable_args(0)->set_offset(kSize - 512);
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

TEST_CASE("A VMM share without its fd is refused", "[cuda_launch]") {
  Fixture fx;
  const std::string uuid(fx.devices->info(0).uuid.bytes, 16);
  v1::SessionResponse resp = fx.session.Handle(Launch(uuid, true), {});
  CHECK(resp.status().code() == int(absl::StatusCode::kInvalidArgument));
  CHECK(resp.status().message().find("expects a VMM fd") != std::string::npos);
}

}  // namespace
}  // namespace kreg
