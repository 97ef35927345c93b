// TakeUploadedModule and HandleControl (daemon/api/control_requests.cc):
// the session socket's control connections, kregd's intake of a registration
// sent on a control connection, with the module as a sealed memfd charged to
// its uid's share of upload bytes in flight before a byte is read;
// ResolveGeneration, what a pinned binding runs (docs/replace.md §7).
#include "daemon/supervisor/broker.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

#include "catch2/catch.hpp"
#include "daemon/api/control_requests.h"
#include "daemon/base/module_upload.h"
#include "daemon/base/protocol_version.h"
#include "daemon/registry/registrar.h"
#include "daemon/registry/registry.h"
#include "daemon/supervisor/local_repointer.h"
#include "daemon/supervisor/session_bindings.h"
#include "tests/daemon/registry/registry_fakes.h"
#include "tests/testing/temp_dir.h"

namespace kreg {
namespace {

constexpr uint64_t kMaxModule = 1 << 20;

UniqueFd SealedModule(const std::string& bytes, int seals = kModuleSeals) {
  UniqueFd fd(::memfd_create("module", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  REQUIRE(fd.ok());
  REQUIRE(::write(fd.get(), bytes.data(), bytes.size()) ==
          static_cast<ssize_t>(bytes.size()));
  if (seals != 0) REQUIRE(::fcntl(fd.get(), F_ADD_SEALS, seals) == 0);
  return fd;
}

struct World : RegistrarWorld {
  explicit World(const std::string& root) : RegistrarWorld(root, kMaxModule) {}
};

v1::RegisterTargetHeader Upload(uint64_t size) {
  v1::RegisterTargetHeader req;
  req.set_target_name("t.uploaded");
  req.set_func_name("F");
  req.set_platform("cpu");
  req.mutable_module()->set_upload_size(size);
  return req;
}

std::vector<UniqueFd> One(UniqueFd fd) {
  std::vector<UniqueFd> fds;
  fds.push_back(std::move(fd));
  return fds;
}

const PeerCred kPeer{::getuid(), ::getgid(), ::getpid()};

UidAccount UploadAccount(uint64_t bytes) {
  UidLimits limits{};
  limits[static_cast<size_t>(UidResource::kUploadBytes)] = bytes;
  return UidAccount(limits);
}

TEST_CASE("An upload is charged to its uid's share before it is read",
          "[broker]") {
  testing::TempDir dir;
  World w(dir.path());
  const std::string module(1000, 'm');
  UidAccount account = UploadAccount(1500);

  SECTION("within the share: taken, and held until the hold goes") {
    UidAccount::Charge hold;
    auto taken = TakeUploadedModule(&w.registrar, Upload(module.size()),
                                    One(SealedModule(module)), kPeer,
                                    kMaxModule, &account, &hold);
    REQUIRE(taken.ok());
    CHECK(*taken == module);
    CHECK(account.Held(kPeer.uid, UidResource::kUploadBytes) == 1000);
  }
  CHECK(account.Held(kPeer.uid, UidResource::kUploadBytes) == 0);

  SECTION("over the share: RESOURCE_EXHAUSTED naming the limit") {
    // Another upload of this uid in flight.
    auto other = account.Take(kPeer.uid, UidResource::kUploadBytes, 1000);
    REQUIRE(other.ok());
    UidAccount::Charge hold;
    auto taken = TakeUploadedModule(&w.registrar, Upload(module.size()),
                                    One(SealedModule(module)), kPeer,
                                    kMaxModule, &account, &hold);
    REQUIRE(!taken.ok());
    CHECK(taken.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK_THAT(std::string(taken.status().message()),
               Catch::Contains("kregd refused a module upload of 1000 bytes "
                               "(counted by its announced size, sparse or "
                               "not): uid ") &&
                   Catch::Contains("holds 1000 bytes of module uploads in "
                                   "flight already") &&
                   Catch::Contains("(max_upload_bytes_per_uid)"));
    CHECK(hold.amount() == 0);
    CHECK(account.Held(kPeer.uid, UidResource::kUploadBytes) == 1000);
    // Another uid keeps its share.
    PeerCred stranger = kPeer;
    stranger.uid = kPeer.uid + 1;
    UidAccount::Charge theirs;
    CHECK(TakeUploadedModule(&w.registrar, Upload(module.size()),
                             One(SealedModule(module)), stranger, kMaxModule,
                             &account, &theirs)
              .ok());
  }
}

TEST_CASE("A registration's bad forms are refused with their reason",
          "[broker]") {
  testing::TempDir dir;
  World w(dir.path());
  UidAccount account = UploadAccount(kMaxModule * 2);
  UidAccount::Charge hold;
  const std::string module(64, 'm');

  SECTION("a memfd on a registration by path") {
    v1::RegisterTargetHeader req = Upload(0);
    req.mutable_module()->set_path("/m.so");
    auto r = TakeUploadedModule(&w.registrar, req, One(SealedModule(module)),
                                kPeer, kMaxModule, &account, &hold);
    REQUIRE(!r.ok());
    CHECK_THAT(std::string(r.status().message()),
               Catch::Contains("carries 1 file descriptor(s); only an upload "
                               "(module.upload_size) may carry one"));
  }
  SECTION("an upload without its memfd") {
    auto r = TakeUploadedModule(&w.registrar, Upload(module.size()), {}, kPeer,
                                kMaxModule, &account, &hold);
    REQUIRE(!r.ok());
    CHECK_THAT(std::string(r.status().message()),
               Catch::Contains("carries 0 file descriptor(s); an upload "
                               "(module.upload_size) needs exactly one"));
  }
  SECTION("two memfds") {
    std::vector<UniqueFd> two = One(SealedModule(module));
    two.push_back(SealedModule(module));
    auto r =
        TakeUploadedModule(&w.registrar, Upload(module.size()), std::move(two),
                           kPeer, kMaxModule, &account, &hold);
    REQUIRE(!r.ok());
    CHECK_THAT(std::string(r.status().message()),
               Catch::Contains("carries 2 file descriptor(s); an upload "
                               "(module.upload_size) needs exactly one"));
  }
  SECTION("an unsealed memfd") {
    auto r = TakeUploadedModule(&w.registrar, Upload(module.size()),
                                One(SealedModule(module, 0)), kPeer, kMaxModule,
                                &account, &hold);
    REQUIRE(!r.ok());
    CHECK_THAT(std::string(r.status().message()),
               Catch::Contains("is not sealed against writing"));
  }
  SECTION("a memfd of another size than announced") {
    auto r = TakeUploadedModule(&w.registrar, Upload(module.size() + 1),
                                One(SealedModule(module)), kPeer, kMaxModule,
                                &account, &hold);
    REQUIRE(!r.ok());
    CHECK_THAT(std::string(r.status().message()),
               Catch::Contains("holds 64 bytes, not the 65 announced in "
                               "module.upload_size"));
  }
  CHECK(account.Held(kPeer.uid, UidResource::kUploadBytes) <=
        module.size() + 1);
}

TEST_CASE("A control hello is answered with kregd's version and module limit",
          "[broker]") {
  BrokerContext ctx;
  ctx.max_module_bytes = kMaxModule;
  v1::SessionRequest req;
  req.set_id(7);
  req.mutable_control_hello()->set_protocol_major(kSessionProtocolMajor);
  req.mutable_control_hello()->set_protocol_minor(kSessionProtocolMinor + 1);
  bool close = false;

  SECTION("of this major: the HelloReply, and the connection goes on") {
    v1::SessionResponse resp = HandleControl(ctx, 1, kPeer, req, {}, &close);
    CHECK(resp.id() == 7);
    CHECK(resp.status().code() == 0);
    CHECK(resp.hello().protocol_major() == kSessionProtocolMajor);
    CHECK(resp.hello().protocol_minor() == kSessionProtocolMinor);
    CHECK(resp.hello().max_module_bytes() == kMaxModule);
    CHECK(resp.hello().session_id() == 0);
    CHECK(!close);
  }
  SECTION("of another major: refused, naming both, and closed") {
    req.mutable_control_hello()->set_protocol_major(kSessionProtocolMajor + 1);
    v1::SessionResponse resp = HandleControl(ctx, 1, kPeer, req, {}, &close);
    CHECK(resp.status().code() ==
          static_cast<int>(absl::StatusCode::kFailedPrecondition));
    CHECK_THAT(resp.status().message(),
               Catch::Contains("the client library speaks session protocol " +
                               std::to_string(kSessionProtocolMajor + 1)) &&
                   Catch::Contains("kregd is older") &&
                   Catch::EndsWith("; closing this control connection"));
    CHECK(!resp.has_hello());
    CHECK(close);
  }
  SECTION("of another major, with a descriptor: the major decides") {
    req.mutable_control_hello()->set_protocol_major(kSessionProtocolMajor + 1);
    v1::SessionResponse resp =
        HandleControl(ctx, 1, kPeer, req, One(SealedModule("x")), &close);
    CHECK_THAT(resp.status().message(),
               Catch::EndsWith("; closing this control connection"));
    CHECK(close);
  }
}

TEST_CASE("A control hello or list with descriptors is refused, naming it",
          "[broker]") {
  BrokerContext ctx;
  v1::SessionRequest req;
  std::string name;
  SECTION("control_hello") {
    req.mutable_control_hello()->set_protocol_major(kSessionProtocolMajor);
    name = "control_hello";
  }
  SECTION("list") {
    req.mutable_list();
    name = "list";
  }
  std::vector<UniqueFd> fds = One(SealedModule("x"));
  fds.push_back(SealedModule("y"));
  bool close = false;
  v1::SessionResponse resp =
      HandleControl(ctx, 1, kPeer, req, std::move(fds), &close);
  CHECK(resp.status().code() ==
        static_cast<int>(absl::StatusCode::kInvalidArgument));
  CHECK(resp.status().message() ==
        name + " carries no file descriptor; 2 attached: send it without any");
  CHECK(!resp.has_hello());
  CHECK(!resp.has_list());
  CHECK(!close);
}

TEST_CASE("A pinned generation resolves to that generation's module",
          "[broker][replace]") {
  FakeLoader loader;
  MemLog log;
  RegistryLimits limits;
  limits.replace_by_owner = true;
  RegistrationService registry(&loader, &log, limits);
  const TargetKey key{"my_op", Platform::kCpu};
  const std::string other =
      "target \"my_op\" (cpu) has no generation 99: its generations are ";
  const std::string what_to_do =
      ". Pin one of these, or bind without a generation to follow the "
      "current one; `kregctl show my_op` lists them";
  REQUIRE(registry.Register(ArgsBy(1000, "my_op", "aa")).ok());

  SECTION("before any replacement: generation 1 is the current entry") {
    CHECK(*ResolveGeneration(registry.core(), key, 1) == registry.Lookup(key));
    auto refused = ResolveGeneration(registry.core(), key, 99);
    CHECK(refused.status().code() == absl::StatusCode::kNotFound);
    CHECK(refused.status().message() ==
          other + "1 (the current one is 1)" + what_to_do);
  }

  RegisterArgs replace = ArgsBy(1000, "my_op", "bb");
  replace.func_name = "Scale2";
  replace.replace = true;
  REQUIRE(registry.Register(replace).ok());
  const EntryPtr current = registry.Lookup(key);
  REQUIRE(current->generation == 2);

  SECTION("generation 0 and the current generation: the current entry") {
    CHECK(*ResolveGeneration(registry.core(), key, 0) == current);
    CHECK(*ResolveGeneration(registry.core(), key, 2) == current);
  }
  SECTION("an older generation: its module and function") {
    auto pinned = ResolveGeneration(registry.core(), key, 1);
    REQUIRE(pinned.ok());
    CHECK((*pinned)->generation == 1);
    CHECK((*pinned)->module_digest == Sha256Digest("aa"));
    CHECK((*pinned)->module_size == 2);
    CHECK((*pinned)->func_name == "Scale");
    CHECK((*pinned)->key == key);
    CHECK(current->module_digest == Sha256Digest("bb"));
  }
  SECTION("a generation the key does not have: NOT_FOUND listing them") {
    auto refused = ResolveGeneration(registry.core(), key, 99);
    CHECK(refused.status().code() == absl::StatusCode::kNotFound);
    CHECK(refused.status().message() ==
          other + "1, 2 (the current one is 2)" + what_to_do);
  }
  SECTION("a retired name has no generations left") {
    REQUIRE(registry.Retire("my_op", Platform::kCpu, {1000, 1000, 1100}).ok());
    for (uint32_t g : {1u, 2u}) {
      auto refused = ResolveGeneration(registry.core(), key, g);
      CHECK(refused.status().code() == absl::StatusCode::kNotFound);
      CHECK(refused.status().message() ==
            "target \"my_op\" (cpu) has no generation " + std::to_string(g) +
                ": it is not registered (retiring a target removes all its "
                "generations). Register it, or check the name with `kregctl "
                "list`");
    }
    auto unpinned = ResolveGeneration(registry.core(), key, 0);
    CHECK(unpinned.status().message() ==
          "target \"my_op\" is not registered for platform cpu in kregd");
  }
}

TEST_CASE(
    "A watch request: refused without re-pointing, with descriptors, "
    "or a second time from one process",
    "[broker][watch]") {
  SessionBindings bindings;
  LocalRepointer repointer(&bindings, nullptr);
  BrokerContext ctx;
  v1::SessionRequest req;
  req.set_id(3);
  req.mutable_watch();
  bool close = false;

  SECTION("replace = deny: nothing to watch") {
    v1::SessionResponse resp = HandleControl(ctx, 1, kPeer, req, {}, &close);
    CHECK(resp.status().code() ==
          static_cast<int>(absl::StatusCode::kFailedPrecondition));
    CHECK(resp.status().message() ==
          "kregd refused watch: it re-points no local bindings (its replace "
          "policy is \"deny\" or local_execution is \"deny\"), so there is "
          "nothing to watch. Closing this connection");
    CHECK(!resp.has_watch());
    CHECK(close);
  }
  ctx.local_repointer = &repointer;
  SECTION("accepted: the WatchReply; then the process's second is refused") {
    v1::SessionResponse resp = HandleControl(ctx, 1, kPeer, req, {}, &close);
    CHECK(resp.id() == 3);
    CHECK(resp.status().code() == 0);
    CHECK(resp.has_watch());
    CHECK(!close);
    resp = HandleControl(ctx, 2, kPeer, req, {}, &close);
    CHECK(resp.status().code() ==
          static_cast<int>(absl::StatusCode::kFailedPrecondition));
    CHECK_THAT(resp.status().message(),
               Catch::Contains("that process has one already (session 1)"));
    CHECK(close);
  }
  SECTION("with a descriptor") {
    v1::SessionResponse resp =
        HandleControl(ctx, 1, kPeer, req, One(SealedModule("x")), &close);
    CHECK(resp.status().message() ==
          "watch carries no file descriptor; 1 attached: send it without any");
    CHECK(!resp.has_watch());
    CHECK(close);
  }
}

TEST_CASE("A repoint_ack on a control connection is refused and closes it",
          "[broker][watch]") {
  BrokerContext ctx;
  v1::SessionRequest req;
  req.mutable_repoint_ack()->set_generation(2);
  bool close = false;
  v1::SessionResponse resp = HandleControl(ctx, 1, kPeer, req, {}, &close);
  CHECK(resp.status().message() ==
        "kregd refused a repoint_ack request on a control connection (a "
        "connection to the session socket whose first request was not "
        "hello): it serves only control_hello, register_target, list and "
        "watch; send repoint_ack on a session (a connection whose first "
        "request is hello). Closing this connection");
  CHECK(close);
}

TEST_CASE("A watch connection reads only repoint_acks without descriptors",
          "[broker][watch]") {
  v1::SessionRequest req;
  v1::RepointAck* ack = req.mutable_repoint_ack();
  ack->set_target_name("demo.t");
  ack->set_platform("cpu");
  ack->set_generation(2);
  std::string payload;
  req.SerializeToString(&payload);

  absl::StatusOr<v1::RepointAck> ok = ReadRepointAck(payload, 0);
  REQUIRE(ok.ok());
  CHECK(ok->generation() == 2);

  absl::StatusOr<v1::RepointAck> with_fd = ReadRepointAck(payload, 1);
  CHECK(with_fd.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(with_fd.status().message() ==
        "kregd closed this watch connection: a repoint_ack carries no file "
        "descriptor, and 1 came with it");

  absl::StatusOr<v1::RepointAck> garbage = ReadRepointAck("\xff\xff\xff", 0);
  CHECK(garbage.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(garbage.status().message() ==
        "kregd closed this watch connection: malformed request (3 bytes do "
        "not parse as kreg.v1.SessionRequest)");

  v1::SessionRequest list;
  list.mutable_list();
  list.SerializeToString(&payload);
  absl::StatusOr<v1::RepointAck> other = ReadRepointAck(payload, 0);
  CHECK(other.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(other.status().message() ==
        "kregd closed this watch connection: it reads only repoint_ack "
        "there, not list; send other requests on a control connection or a "
        "session");
}

}  // namespace
}  // namespace kreg
