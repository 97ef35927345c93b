// registration_mapper.h: both front ends' registration messages to the
// Registrar's request and back, field by field, and every refusal.
#include "daemon/registry/registration_mapper.h"

#include <string>

#include "catch2/catch.hpp"
#include "tests/daemon/registry/registry_fakes.h"
#include "tests/testing/temp_dir.h"

namespace kreg {
namespace {

const std::string kElf =
    "\x7f"
    "ELF module";

v1::RegisterTargetHeader Header(const std::string& name) {
  v1::RegisterTargetHeader h;
  h.set_target_name(name);
  h.set_func_name("Scale");
  h.set_platform("GPU");
  h.set_content_id("build:1");
  h.set_replace(true);
  h.mutable_module()->set_file_name("libdemo.so");
  return h;
}

TEST_CASE("ToRegistrationRequest copies every field of a path registration",
          "[registration_mapper]") {
  v1::RegisterTargetHeader h = Header("demo.scale");
  h.mutable_module()->set_path("/srv/kernels/libdemo.so");
  absl::StatusOr<RegistrationRequest> r = ToRegistrationRequest(h, "");
  REQUIRE(r.ok());
  CHECK(r->target_name == "demo.scale");
  CHECK(r->func_name == "Scale");
  CHECK(r->platform == "GPU");  // validated by the Registrar, not here
  CHECK(r->content_id == "build:1");
  CHECK(r->file_name == "libdemo.so");
  CHECK(r->replace);
  CHECK_FALSE(r->in_process);
  CHECK(r->source == RegistrationRequest::Source::kPath);
  CHECK(r->path == "/srv/kernels/libdemo.so");
  CHECK(r->upload_size == 0);
  CHECK(r->upload.empty());
}

TEST_CASE("ToRegistrationRequest takes an upload's size and bytes",
          "[registration_mapper]") {
  v1::RegisterTargetHeader h = Header("demo.scale");
  h.mutable_module()->set_upload_size(99);  // the Registrar compares
  absl::StatusOr<RegistrationRequest> r = ToRegistrationRequest(h, kElf);
  REQUIRE(r.ok());
  CHECK(r->source == RegistrationRequest::Source::kUpload);
  CHECK(r->upload_size == 99);
  CHECK(r->upload == kElf);
  CHECK(r->path.empty());
}

TEST_CASE("ToRegistrationRequest passes an in-process callable on",
          "[registration_mapper]") {
  v1::RegisterTargetHeader h = Header("numba.fn");
  h.set_in_process(true);
  absl::StatusOr<RegistrationRequest> r = ToRegistrationRequest(h, "");
  REQUIRE(r.ok());
  CHECK(r->in_process);
  CHECK(r->source == RegistrationRequest::Source::kNone);
}

TEST_CASE("ToRegistrationRequest refuses bytes next to a path, quoting it",
          "[registration_mapper]") {
  v1::RegisterTargetHeader h = Header("demo.scale");
  h.mutable_module()->set_path("/srv/lib\xff.so");
  absl::StatusOr<RegistrationRequest> r = ToRegistrationRequest(h, kElf);
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(r.status().message() ==
        "11 module bytes came with a registration that announces the module "
        "path \"/srv/lib\\xff.so\"; send either a path or the bytes "
        "(module.upload_size)");
}

TEST_CASE("ToRegistrationRequest refuses bytes without any module",
          "[registration_mapper]") {
  v1::RegisterTargetHeader h = Header("numba.fn");
  h.set_in_process(true);
  absl::StatusOr<RegistrationRequest> r = ToRegistrationRequest(h, "xyz");
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(r.status().message() ==
        "3 module bytes came with a registration that announces no module; "
        "send either a path or the bytes (module.upload_size)");
}

TargetEntry Entry(Platform platform) {
  TargetEntry e;
  e.key = {"demo.scale", platform};
  e.func_name = "Scale";
  e.content_id = "build:1";
  e.module_digest = "sha256:ab";
  e.module_size = 4096;
  e.handler_info = HandlerInfo{0, 4, 1, 0};
  e.registered_by = PeerCred{1000, 100, 4242};
  e.registered_at_us = 1234567;
  e.origin = "upload:4096 bytes";
  e.host = "node1 (10.0.0.1:7000)";
  return e;
}

TEST_CASE("DescribeTarget fills every Target field from the entry",
          "[registration_mapper]") {
  v1::Target t = DescribeTarget(Entry(Platform::kCuda), absl::OkStatus());
  CHECK(t.target_name() == "demo.scale");
  CHECK(t.platform() == "cuda");
  CHECK(t.func_name() == "Scale");
  CHECK(t.content_id() == "build:1");
  CHECK(t.module_digest() == "sha256:ab");
  CHECK(t.module_size() == 4096);
  CHECK(t.kind() == "module");
  CHECK(t.ffi_api_major() == 0);
  CHECK(t.ffi_api_minor() == 4);
  CHECK(t.traits() == 1);
  CHECK(t.audit().uid() == 1000);
  CHECK(t.audit().gid() == 100);
  CHECK(t.audit().pid() == 4242);
  CHECK(t.audit().registered_at_us() == 1234567);
  CHECK(t.audit().origin() == "upload:4096 bytes");
  CHECK(t.audit().host() == "node1 (10.0.0.1:7000)");
  CHECK(t.not_runnable().empty());
  CHECK_FALSE(t.has_stats());
}

TEST_CASE("DescribeTarget says why a target cannot run here",
          "[registration_mapper]") {
  const absl::Status no_gpu = absl::UnavailableError("no CUDA device");
  CHECK(DescribeTarget(Entry(Platform::kCuda), no_gpu).not_runnable() ==
        "this kregd cannot run CUDA launches: no CUDA device");
  CHECK(DescribeTarget(Entry(Platform::kCpu), no_gpu).not_runnable().empty());
  TargetEntry lost = Entry(Platform::kCpu);
  lost.unavailable = "store file missing";
  CHECK(DescribeTarget(lost, absl::OkStatus()).not_runnable() ==
        "its module could not be loaded (store file missing)");
  TargetEntry callable = Entry(Platform::kCuda);
  callable.kind = TargetKind::kInProcess;
  CHECK(DescribeTarget(callable, no_gpu).kind() == "in-process");
  CHECK(DescribeTarget(callable, no_gpu).not_runnable().empty());
}

struct World {
  World()
      : registry(&loader, &log),
        registrar(&registry, ModulePolicy{{dir.path()}, 1 << 20, ""}) {}
  testing::TempDir dir;
  FakeLoader loader;
  MemLog log;
  Registry registry;
  Registrar registrar;
};

const PeerCred kPeer{1000, 100, 4242};

v1::RegisterTargetHeader Upload(const std::string& name,
                                const std::string& content_id) {
  v1::RegisterTargetHeader h;
  h.set_target_name(name);
  h.set_func_name("Scale");
  h.set_platform("cpu");
  h.set_content_id(content_id);
  h.mutable_module()->set_upload_size(kElf.size());
  return h;
}

TEST_CASE("RegisterFromHeader registers and answers with the entry",
          "[registration_mapper]") {
  World w;
  auto first = RegisterFromHeader(&w.registrar, Upload("demo.scale", "c1"),
                                  kElf, kPeer, absl::OkStatus());
  REQUIRE(first.ok());
  CHECK(first->created());
  CHECK(first->target().target_name() == "demo.scale");
  CHECK(first->target().platform() == "cpu");
  CHECK(first->target().content_id() == "c1");
  CHECK(first->target().module_size() == kElf.size());
  CHECK(first->target().audit().pid() == 4242);
  auto again = RegisterFromHeader(&w.registrar, Upload("demo.scale", "c1"),
                                  kElf, kPeer, absl::OkStatus());
  REQUIRE(again.ok());
  CHECK_FALSE(again->created());
  CHECK(w.log.entries.size() == 1);

  v1::ListTargetsResponse listed =
      DescribeTargets(w.registry, absl::OkStatus());
  REQUIRE(listed.targets_size() == 1);
  CHECK(listed.targets(0).target_name() == "demo.scale");
}

TEST_CASE("RegisterFromHeader passes refusals on verbatim",
          "[registration_mapper]") {
  World w;
  SECTION("the mapper's own") {
    v1::RegisterTargetHeader h = Upload("demo.scale", "c1");
    h.mutable_module()->set_path("/m.so");
    auto r = RegisterFromHeader(&w.registrar, h, kElf, kPeer, absl::OkStatus());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(r.status().message()),
               Catch::Contains("the module path \"/m.so\""));
  }
  SECTION("the Registrar's, naming the bad value") {
    auto r = RegisterFromHeader(&w.registrar, Upload("9bad name", "c1"), kElf,
                                kPeer, absl::OkStatus());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(r.status().message()),
               Catch::Contains("\"9bad name\""));
  }
  SECTION("a conflict") {
    REQUIRE(RegisterFromHeader(&w.registrar, Upload("demo.scale", "c1"), kElf,
                               kPeer, absl::OkStatus())
                .ok());
    auto r = RegisterFromHeader(&w.registrar, Upload("demo.scale", "c2"), kElf,
                                kPeer, absl::OkStatus());
    CHECK(r.status().code() == absl::StatusCode::kFailedPrecondition);
  }
  CHECK(w.log.entries.size() <= 1);
}

TEST_CASE("RefusalDetail names what was asked and what is bound",
          "[registration_mapper]") {
  World w;
  REQUIRE(RegisterFromHeader(&w.registrar, Upload("demo.scale", "c1"), kElf,
                             kPeer, absl::OkStatus())
              .ok());
  v1::RegisterTargetHeader h = Upload("demo.scale", "c2");
  h.set_platform("HOST");
  h.set_func_name("ScaleV2");
  h.set_replace(true);
  v1::KernelRegistrationError e = RefusalDetail(h, w.registry);
  CHECK(e.target_name() == "demo.scale");
  CHECK(e.platform() == "cpu");
  CHECK(e.requested_content_id() == "c2");
  CHECK(e.requested_func_name() == "ScaleV2");
  CHECK(e.replace_requested());
  CHECK(e.existing_content_id() == "c1");
  CHECK(e.existing_func_name() == "Scale");

  h.set_target_name("other");
  e = RefusalDetail(h, w.registry);
  CHECK(e.platform() == "cpu");
  CHECK(e.existing_content_id().empty());

  h.set_platform("rocm");  // no platform, nothing looked up
  e = RefusalDetail(h, w.registry);
  CHECK(e.platform().empty());
  CHECK(e.requested_content_id() == "c2");
}

v1::RegisterTargetHeader BundleHeader() {
  v1::RegisterTargetHeader h;
  auto* f = h.add_stages();
  f->set_stage("execute");
  f->set_symbol("Exec");
  f = h.add_stages();
  f->set_stage("instantiate");
  f->set_symbol("Init");
  h.mutable_state_type()->set_name("my.T");
  h.mutable_state_type()->set_type_id_symbol("TId");
  h.mutable_state_type()->set_type_info_symbol("TInfo");
  return h;
}

TEST_CASE("A header's stages spell one canonical bundle", "[mapper]") {
  v1::RegisterTargetHeader h = BundleHeader();
  absl::StatusOr<std::string> f = FuncNameOf(h);
  REQUIRE(f.ok());
  CHECK(*f == "instantiate=Init;execute=Exec;state_type=my.T/TId/TInfo");
  h.set_func_name("Exec");  // the execute function may be repeated
  CHECK(FuncNameOf(h).value() == *f);
  v1::RegisterTargetHeader plain;
  plain.set_func_name("Exec");
  CHECK(FuncNameOf(plain).value() == "Exec");
}

TEST_CASE("A header's bad stages are refused naming stage and symbol",
          "[mapper]") {
  v1::RegisterTargetHeader h = BundleHeader();
  h.mutable_stages(1)->set_stage("record");
  CHECK_THAT(
      std::string(FuncNameOf(h).status().message()),
      Catch::StartsWith("unknown stage \"record\" (for symbol \"Init\")"));
  h = BundleHeader();
  h.mutable_stages(1)->set_stage("execute");
  CHECK_THAT(std::string(FuncNameOf(h).status().message()),
             Catch::StartsWith("stage execute is given twice (\"Exec\" and "
                               "\"Init\")"));
  h = BundleHeader();
  h.mutable_stages(0)->set_stage("prepare");
  CHECK_THAT(std::string(FuncNameOf(h).status().message()),
             Catch::StartsWith("the handler bundle has no execute function"));
  h = BundleHeader();
  h.set_func_name("Other");
  CHECK_THAT(std::string(FuncNameOf(h).status().message()),
             Catch::StartsWith("func_name \"Other\" differs from the "
                               "bundle's execute function \"Exec\""));
  h = BundleHeader();
  h.mutable_stages(1)->set_symbol("not a symbol");
  CHECK(FuncNameOf(h).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(FuncNameOf(h).status().message()),
             Catch::StartsWith("the instantiate function \"not a symbol\""));
}

}  // namespace
}  // namespace kreg
