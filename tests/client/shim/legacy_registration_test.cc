// The shim against a kregd older than session protocol 1.7 (DESIGN §12: the
// wheel and kregd upgrade in either order): the flat 1.0-1.6 messages'
// mapping (client/shim/legacy_registration.cc), and registration, listing
// and BindLocal through a Client against fake kregds that say 1.2, 1.6 and
// 1.7 in their HelloReply.
#include "client/shim/legacy_registration.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>

#include "catch2/catch.hpp"
#include "client/shim/client.h"
#include "tests/client/shim/fake_kregd.h"

namespace kreg::shim {
namespace {

v1::TargetInfo Info() {
  v1::TargetInfo i;
  i.set_target_name("demo.scale");
  i.set_platform("cpu");
  i.set_func_name("Scale");
  i.set_content_id("sha256:c0");
  i.set_module_digest("sha256:d1");
  i.set_module_size(4096);
  i.set_kind("module");
  i.set_ffi_api_major(0);
  i.set_ffi_api_minor(1);
  i.set_traits(2);
  i.set_uid(1000);
  i.set_gid(100);
  i.set_pid(4242);
  i.set_registered_at_us(1700000000000000);
  i.set_origin("upload:4096 bytes");
  i.set_not_runnable("no GPU");
  return i;
}

v1::RegisterTargetHeader Header() {
  v1::RegisterTargetHeader h;
  h.set_target_name("demo.scale");
  h.set_func_name("Scale");
  h.set_platform("cpu");
  h.set_content_id("build-7");
  h.set_replace(true);
  h.mutable_module()->set_file_name("libdemo.so");
  return h;
}

TEST_CASE("FromTargetInfo gathers the audit fields", "[shim][legacy]") {
  v1::Target t = FromTargetInfo(Info());
  CHECK(t.target_name() == "demo.scale");
  CHECK(t.platform() == "cpu");
  CHECK(t.func_name() == "Scale");
  CHECK(t.content_id() == "sha256:c0");
  CHECK(t.module_digest() == "sha256:d1");
  CHECK(t.module_size() == 4096);
  CHECK(t.kind() == "module");
  CHECK(t.ffi_api_minor() == 1);
  CHECK(t.traits() == 2);
  CHECK(t.audit().uid() == 1000);
  CHECK(t.audit().gid() == 100);
  CHECK(t.audit().pid() == 4242);
  CHECK(t.audit().registered_at_us() == 1700000000000000);
  CHECK(t.audit().origin() == "upload:4096 bytes");
  CHECK(t.audit().host().empty());
  CHECK(t.not_runnable() == "no GPU");
}

TEST_CASE("ToLegacyRegister flattens each kind of module", "[shim][legacy]") {
  v1::RegisterTargetHeader h = Header();
  h.mutable_module()->set_path("/opt/k/libdemo.so");
  v1::RegisterRequest r = ToLegacyRegister(h, "", false);
  CHECK(r.target_name() == "demo.scale");
  CHECK(r.func_name() == "Scale");
  CHECK(r.platform() == "cpu");
  CHECK(r.content_id() == "build-7");
  CHECK(r.replace());
  CHECK(r.file_name() == "libdemo.so");
  CHECK(r.path() == "/opt/k/libdemo.so");

  h.mutable_module()->set_upload_size(3);
  r = ToLegacyRegister(h, "abc", false);
  CHECK(r.module_case() == v1::RegisterRequest::kUploadFdSize);
  CHECK(r.upload_fd_size() == 3);
  r = ToLegacyRegister(h, "abc", true);  // a kregd before 1.3
  CHECK(r.module_case() == v1::RegisterRequest::kUpload);
  CHECK(r.upload() == "abc");

  v1::RegisterTargetHeader callable;
  callable.set_target_name("numba.f");
  callable.set_in_process(true);
  callable.set_content_id("fp");
  r = ToLegacyRegister(callable, "", false);
  CHECK(r.in_process());
  CHECK(r.module_case() == v1::RegisterRequest::MODULE_NOT_SET);
}

TEST_CASE("AdoptLegacyReply turns 1.0-1.6 replies into 1.7 ones",
          "[shim][legacy]") {
  v1::SessionResponse reg;
  reg.mutable_legacy_register()->set_created(true);
  *reg.mutable_legacy_register()->mutable_target() = Info();
  AdoptLegacyReply(&reg);
  REQUIRE(reg.has_register_target());
  CHECK(reg.register_target().created());
  CHECK(reg.register_target().target().audit().pid() == 4242);

  v1::SessionResponse list;
  *list.mutable_legacy_list()->add_targets() = Info();
  *list.mutable_legacy_list()->add_targets() = Info();
  AdoptLegacyReply(&list);
  REQUIRE(list.has_list());
  CHECK(list.list().targets_size() == 2);
  CHECK(list.list().targets(1).audit().uid() == 1000);

  v1::SessionResponse bind;
  *bind.mutable_bind_local()->mutable_legacy_target() = Info();
  AdoptLegacyReply(&bind);
  CHECK(bind.bind_local().target().module_digest() == "sha256:d1");
  CHECK_FALSE(bind.bind_local().has_legacy_target());

  // 1.7 replies are left as they are.
  v1::SessionResponse now;
  now.mutable_register_target()->mutable_target()->set_target_name("x");
  const std::string before = now.SerializeAsString();
  AdoptLegacyReply(&now);
  CHECK(now.SerializeAsString() == before);
}

v1::HelloReply HelloOf(uint32_t minor, uint64_t max_module_bytes) {
  v1::HelloReply r;
  r.set_session_id(7);
  r.set_protocol_major(1);
  r.set_protocol_minor(minor);
  r.set_max_arena_bytes(4u << 20);
  r.set_max_message_bytes(1u << 20);
  r.set_max_module_bytes(max_module_bytes);
  return r;
}

// Answers one registration as a kregd of `minor` would, with Info().
void AnswerRegistration(Peer* p, uint32_t minor, uint64_t max_module_bytes) {
  if (!p->Hello(HelloOf(minor, max_module_bytes))) return;
  v1::SessionRequest req;
  if (!p->Recv(&req)) return;
  v1::SessionResponse resp;
  resp.set_id(req.id());
  if (minor < 7) {
    resp.mutable_legacy_register()->set_created(true);
    *resp.mutable_legacy_register()->mutable_target() = Info();
  } else {
    resp.mutable_register_target()->set_created(true);
    *resp.mutable_register_target()->mutable_target() = FromTargetInfo(Info());
  }
  p->Send(resp);
}

Registration Upload() {
  Registration r;
  r.header = Header();
  r.module =
      "\x7f"
      "ELF module";
  r.header.mutable_module()->set_upload_size(r.module.size());
  return r;
}

TEST_CASE("A registration reaches kregds of 1.2, 1.6 and 1.7 in their form",
          "[shim][legacy]") {
  struct Case {
    uint32_t minor;
    uint64_t max_module_bytes;
    bool legacy, inline_upload;
  };
  for (const Case& c : {Case{2, 0, true, true}, Case{6, 1u << 20, true, false},
                        Case{7, 1u << 20, false, false}}) {
    INFO("kregd 1." << c.minor);
    FakeKregd kregd(
        [&](Peer* p) { AnswerRegistration(p, c.minor, c.max_module_bytes); });
    v1::RegisterTargetResponse out;
    {
      Client client(kregd.path);
      ClientStatus s = client.Register(Upload(), &out);
      INFO(s.message);
      REQUIRE(s.ok());
    }
    kregd.Join();
    // Either way the caller reads registration.proto's Target.
    CHECK(out.created());
    CHECK(out.target().audit().origin() == "upload:4096 bytes");
    REQUIRE(kregd.requests.size() == 2);
    const v1::SessionRequest& req = kregd.requests[1];
    CHECK(kregd.requests[0].hello().protocol_minor() == 7);
    if (c.legacy) {
      REQUIRE(req.has_legacy_register());
      CHECK(req.legacy_register().target_name() == "demo.scale");
      CHECK(req.legacy_register().file_name() == "libdemo.so");
      if (c.inline_upload) {
        CHECK(req.legacy_register().upload() == Upload().module);
      } else {
        CHECK(req.legacy_register().upload_fd_size() == Upload().module.size());
      }
    } else {
      REQUIRE(req.has_register_target());
      CHECK(req.register_target().module().upload_size() ==
            Upload().module.size());
    }
    // An fd upload attaches one sealed memfd of the module's size.
    if (c.inline_upload) {
      CHECK(kregd.fd_sizes.empty());
    } else {
      REQUIRE(kregd.fd_sizes.size() == 1);
      CHECK(kregd.fd_sizes[0] == int64_t(Upload().module.size()));
      CHECK((kregd.fd_seals[0] & F_SEAL_WRITE) != 0);
    }
  }
}

TEST_CASE("A path registration reaches kregds of 1.6 and 1.7 as a path",
          "[shim][legacy]") {
  for (uint32_t minor : {6u, 7u}) {
    INFO("kregd 1." << minor);
    FakeKregd kregd([&](Peer* p) { AnswerRegistration(p, minor, 1u << 20); });
    Registration reg;
    reg.header = Header();
    reg.header.mutable_module()->set_path("/opt/k/libdemo.so");
    v1::RegisterTargetResponse out;
    {
      Client client(kregd.path);
      ClientStatus s = client.Register(reg, &out);
      INFO(s.message);
      REQUIRE(s.ok());
    }
    kregd.Join();
    REQUIRE(kregd.requests.size() == 2);
    const v1::SessionRequest& req = kregd.requests[1];
    if (minor < 7) {
      CHECK(req.legacy_register().path() == "/opt/k/libdemo.so");
    } else {
      CHECK(req.register_target().module().path() == "/opt/k/libdemo.so");
      CHECK(req.register_target().module().file_name() == "libdemo.so");
    }
    CHECK(kregd.fd_sizes.empty());
  }
}

TEST_CASE("List and BindLocal read a 1.6 kregd's flat targets",
          "[shim][legacy]") {
  FakeKregd kregd([&](Peer* p) {
    if (!p->Hello(HelloOf(6, 1u << 20))) return;
    v1::SessionRequest req;
    if (!p->Recv(&req)) return;
    v1::SessionResponse resp;
    resp.set_id(req.id());
    *resp.mutable_legacy_list()->add_targets() = Info();
    p->Send(resp);
    if (!p->Recv(&req)) return;
    resp.Clear();
    resp.set_id(req.id());
    *resp.mutable_bind_local()->mutable_legacy_target() = Info();
    int fd = ::memfd_create("module", MFD_CLOEXEC);
    p->Send(resp, &fd, 1);
    ::close(fd);
  });
  v1::ListTargetsResponse list;
  v1::BindLocalReply bind;
  UniqueFd module;
  {
    Client client(kregd.path);
    ClientStatus s = client.List(&list);
    INFO(s.message);
    REQUIRE(s.ok());
    s = client.BindLocal("demo.scale", "cpu", &bind, &module);
    INFO(s.message);
    REQUIRE(s.ok());
  }
  kregd.Join();
  REQUIRE(list.targets_size() == 1);
  CHECK(list.targets(0).audit().gid() == 100);
  CHECK(bind.target().module_size() == 4096);
  CHECK(bind.target().func_name() == "Scale");
  CHECK(module.ok());
}

}  // namespace
}  // namespace kreg::shim
