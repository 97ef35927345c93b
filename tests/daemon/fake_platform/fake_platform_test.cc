// A third platform added with new files and one row per platform table
// (fake_platform.cc; docs/adding-a-platform.md): kregd parses and names it,
// applies its registry and status rules, dispatches its socket and ring
// launches to its executor and gives its handlers the XLA FFI pieces its
// row says, without a change anywhere else.
#include "tests/daemon/fake_platform/fake_platform.h"

#include <string.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/platforms.h"
#include "daemon/base/platform_table.h"
#include "daemon/base/validate.h"
#include "daemon/compile_service/compile_request.h"
#include "daemon/executor/ffi/ffi_host.h"
#include "daemon/executor/platform_executors.h"
#include "daemon/executor/ring_decoder.h"
#include "daemon/executor/session.h"
#include "daemon/registry/registry.h"
#include "daemon/registry/runnable.h"
#include "tests/daemon/executor/test_util.h"
#include "tests/daemon/registry/registry_fakes.h"
#include "tests/testing/launch_spec.h"
#include "xla/ffi/api/ffi.h"

namespace kreg {
namespace {

namespace ffi = ::xla::ffi;
using ::kreg::testing::EncodeSpec;
using ::kreg::testing::FakeExecutor;
using ::kreg::testing::LaunchRequest;
using ::kreg::testing::LaunchSpec;
using ::kreg::testing::MakeMemfd;
using ::kreg::testing::RegisterFakePlatform;

ffi::Error DoubleImpl(ffi::Buffer<ffi::F32> in,
                      ffi::ResultBuffer<ffi::F32> out) {
  for (size_t i = 0; i < in.element_count(); ++i) {
    out->typed_data()[i] = 2 * in.typed_data()[i];
  }
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER(
    kDouble, DoubleImpl,
    ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>());

ffi::Error StreamImpl(void*) { return ffi::Error::Success(); }
XLA_FFI_DEFINE_HANDLER(kStream, StreamImpl,
                       ffi::Ffi::Bind().Ctx<ffi::PlatformStream<void*>>());

// XLA_FFI_ThreadPool_NumThreads through the C API (ffi::ThreadPool's
// wrapper drops its error).
XLA_FFI_Error* NumThreads(XLA_FFI_CallFrame* f) {
  int64_t n = 0;
  XLA_FFI_ThreadPool_NumThreads_Args args{
      XLA_FFI_ThreadPool_NumThreads_Args_STRUCT_SIZE, nullptr, f->ctx, &n};
  return f->api->XLA_FFI_ThreadPool_NumThreads(&args);
}

ffi::Error ScratchImpl(ffi::ScratchAllocator scratch) {
  std::optional<void*> p = scratch.Allocate(256, 64);
  if (!p.has_value()) return ffi::Error::Internal("no scratch memory");
  memset(*p, 0x5a, 256);  // host memory: writable from here
  return ffi::Error::Success();
}
XLA_FFI_DEFINE_HANDLER(kScratch, ScratchImpl,
                       ffi::Ffi::Bind().Ctx<ffi::ScratchAllocator>());

void* AsHandler(XLA_FFI_Handler* h) { return reinterpret_cast<void*>(h); }

// Runs the handlers above through a real FfiHost, "double" on every
// platform.
class HostBackend : public SessionBackend {
 public:
  absl::StatusOr<ResolvedHandler> Lookup(const TargetKey& key,
                                         uint32_t) override {
    if (key.name != "double") return absl::NotFoundError(key.name);
    last_platform = key.platform;
    return ResolvedHandler{AsHandler(kDouble)};
  }
  absl::Status Execute(void* handler, const LaunchFrame& frame) override {
    return host.Execute(handler, frame);
  }
  uint32_t ffi_api_major() const override { return 0; }
  uint32_t ffi_api_minor() const override { return 4; }
  FfiHost host;
  Platform last_platform = Platform::kCpu;
};

// A Launch of "double" on `platform` over the arena: 4 floats at 0 -> 64.
LaunchSpec DoubleLaunch(const std::string& platform) {
  LaunchSpec l;
  l.set_target_name("double");
  l.set_platform(platform);
  for (auto* b : {l.add_args(), l.add_rets()}) {
    b->set_dtype(XLA_FFI_DataType_F32);
    b->add_dims(4);
    b->set_size(16);
  }
  l.mutable_rets(0)->set_offset(64);
  return l;
}

std::string Encode(const LaunchSpec& l, uint64_t doorbell_seq = 0) {
  LaunchSpec copy = l;
  copy.set_doorbell_seq(doorbell_seq);
  return EncodeSpec(copy, 0, 42);
}

TEST_CASE("A fake platform parses, names itself and is listed", "[platform]") {
  const Platform fake = RegisterFakePlatform();
  CHECK(static_cast<size_t>(fake) == kNumPlatforms);
  CHECK(*ParsePlatform("fake") == fake);
  CHECK(*ParsePlatform("PHONY") == fake);
  CHECK(std::string(PlatformName(fake)) == "fake");
  CHECK(PlatformChoices() ==
        "\"cpu\" (alias \"host\"), \"cuda\" (alias \"gpu\") or \"fake\" "
        "(alias \"phony\")");
  CHECK(AllPlatforms() ==
        std::vector<Platform>{Platform::kCpu, Platform::kCuda, fake});
  // The built-in rows are unchanged, and a row cannot be added twice.
  CHECK(*ParsePlatform("host") == Platform::kCpu);
  CHECK(AddPlatformForTest({"fake", "FAKE", nullptr}) == -1);
  CHECK_FALSE(AddPlatformTraitsForTest(TraitsOf(fake)));
}

TEST_CASE("A fake target follows its row's registry and status rules",
          "[platform]") {
  const Platform fake = RegisterFakePlatform();
  TargetEntry e;
  e.key = {"op", fake};
  // Host memory: runnable on a kregd that cannot run CUDA launches.
  CHECK(NotRunnableReason(e, absl::UnavailableError("no GPU")).empty());

  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  REQUIRE(registry.Register(Args("op", "aa", "Scale", fake)).ok());
  REQUIRE(registry.Register(Args("op", "aa", "Scale", Platform::kCpu)).ok());
  std::vector<EntryPtr> found = registry.Find("op");
  REQUIRE(found.size() == 2);
  CHECK(found[1]->key.platform == fake);
  CHECK(Named(found[1]->key) == "target \"op\" (fake)");

  // Built with the C++ compiler: C and C++ sources, no .cu.
  v1::CompileTargetRequest compile;
  compile.set_target_name("op");
  compile.set_func_name("Handler");
  compile.set_platform("phony");
  v1::SourceFile* source = compile.add_sources();
  source->set_name("op.cc");
  absl::StatusOr<CompileRequest> parsed = ParseCompileRequest(compile);
  REQUIRE(parsed.ok());
  CHECK(parsed->platform == fake);
  source->set_name("op.cu");
  CHECK_THAT(std::string(ParseCompileRequest(compile).status().message()),
             Catch::Contains("needs a C or C++ source extension"));
}

struct SessionFixture {
  SessionFixture()
      : session(7, UniqueFd(), PeerCred{1, 2, 3}, SessionLimits(), &backend,
                &counters) {
    v1::SessionRequest hello;
    hello.mutable_hello()->set_protocol_major(kSessionProtocolMajor);
    REQUIRE(session.Handle(hello, {}).status().code() == 0);
    v1::SessionRequest grow;
    grow.mutable_arena_grow()->set_size(4096);
    fd = MakeMemfd(4096);
    std::vector<UniqueFd> fds;
    fds.push_back(UniqueFd(::dup(fd.get())));
    REQUIRE(session.Handle(grow, std::move(fds)).status().code() == 0);
    data = static_cast<float*>(
        ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0));
    REQUIRE(data != MAP_FAILED);
    for (int i = 0; i < 4; ++i) data[i] = static_cast<float>(i + 1);
  }
  ~SessionFixture() { ::munmap(data, 4096); }
  HostBackend backend;
  SessionCounters counters;
  Session session;
  UniqueFd fd;
  float* data = nullptr;
};

TEST_CASE("A fake platform's socket launches go to its executor",
          "[platform]") {
  const Platform fake = RegisterFakePlatform();
  SessionFixture fx;
  const int before = FakeExecutor::socket_launches.load();
  v1::SessionResponse resp =
      fx.session.Handle(LaunchRequest(DoubleLaunch("phony"), 1), {});
  INFO(resp.status().message());
  REQUIRE(resp.status().code() == 0);
  CHECK(FakeExecutor::socket_launches.load() == before + 1);
  CHECK(fx.backend.last_platform == fake);
  CHECK(fx.data[16] == 2.0f);
  CHECK(fx.data[19] == 8.0f);

  // A CPU launch still goes to the CPU executor.
  REQUIRE(fx.session.Handle(LaunchRequest(DoubleLaunch("cpu"), 2), {})
              .status()
              .code() == 0);
  CHECK(FakeExecutor::socket_launches.load() == before + 1);
  CHECK(fx.backend.last_platform == Platform::kCpu);
}

TEST_CASE(
    "A fake platform's ring descriptors: its row checks the header, "
    "its executor runs them",
    "[platform][ring]") {
  const Platform fake = RegisterFakePlatform();
  ShmArena arena(1 << 20);
  UniqueFd fd = MakeMemfd(4096);
  REQUIRE(arena.Replace(UniqueFd(::dup(fd.get())), 4096).ok());
  RingDecoder decoder;
  uint64_t tag = 0;
  const std::string bytes = Encode(DoubleLaunch("fake"));
  absl::StatusOr<RingLaunchHeader> header =
      decoder.Header(bytes.data(), bytes.size(), 0, &tag);
  REQUIRE(header.ok());
  CHECK(header->platform == fake);
  CHECK(tag == 42);

  // Host memory: a descriptor with CUDA fields is refused, named by the row.
  const std::string cuda_fields = Encode(DoubleLaunch("fake"), 3);
  CHECK(decoder.Header(cuda_fields.data(), cuda_fields.size(), 0, &tag)
            .status()
            .message() ==
        "launching \"double\": a FAKE launch descriptor carries CUDA fields "
        "(doorbell sequence number 3)");

  HostBackend backend;
  HandlerTable handlers(&backend);
  SessionContext ctx{1, PeerCred{}, &backend, &arena, &handlers};
  std::vector<std::unique_ptr<LaunchExecutor>> executors =
      MakeLaunchExecutors(ctx);
  REQUIRE(executors.size() == 3);
  const int before = FakeExecutor::ring_launches.load();
  LaunchExecutor::Request request{
      tag, &*header, [&](const CudaBufferResolver* resolve) {
        CHECK(resolve == nullptr);
        return decoder.Decode(bytes.data(), bytes.size(), 0, arena, &tag,
                              resolve);
      }};
  absl::Status s =
      executors[static_cast<size_t>(header->platform)]->Launch(&request);
  REQUIRE(s.ok());
  CHECK(FakeExecutor::ring_launches.load() == before + 1);
  CHECK(backend.last_platform == fake);
  CHECK(request.flags == 0);
  CHECK_FALSE(request.end_session);
}

TEST_CASE("A fake platform's handlers get the XLA FFI pieces of its row",
          "[platform][ffi_host]") {
  const Platform fake = RegisterFakePlatform();
  FfiHost host;
  LaunchFrame frame;
  frame.platform = fake;
  // No stream (as on the CPU), no thread pool (as on CUDA): each error
  // names the platform.
  CHECK_THAT(std::string(host.Execute(AsHandler(kStream), frame).message()),
             Catch::Contains("this call runs on the fake platform, which has "
                             "no stream"));
  CHECK_THAT(std::string(host.Execute(AsHandler(NumThreads), frame).message()),
             Catch::Contains("no thread pool on the fake platform"));
  // Host memory: scratch comes from the host, no device allocator needed.
  CHECK(host.Execute(AsHandler(kScratch), frame).ok());
}

}  // namespace
}  // namespace kreg
