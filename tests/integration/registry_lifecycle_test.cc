// kregd's registry against hostile and careless users, over real gRPC from
// root and from uid 65534: content_id claims, per-uid limits, retire, gc
// (DESIGN §2 and §6; docs/operator-guide.md "State, backup, upgrades").
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "kreg/v1/registry.grpc.pb.h"
#include "tests/testing/daemon_fixture.h"
#include "tests/testing/temp_dir.h"

namespace kreg {
namespace {

using testing::Daemon;
using testing::Kregctl;
using testing::ReadFile;
using testing::TempDir;

RegisterRequest Upload(const Daemon& d, const std::string& name,
                       const std::string& lib = "libdemo.so",
                       const std::string& func = "Scale") {
  RegisterRequest r;
  r.target_name = name;
  r.func_name = func;
  r.module_bytes = ReadFile(d.Kernel(lib));
  return r;
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

constexpr uid_t kNobody = 65534;

// A client whose connection kregd attributes to `uid`: SO_PEERCRED is taken
// at connect(), so a child switches to `uid`, connects and hands the socket
// back over SCM_RIGHTS (the child runs no gRPC). Opens the test directory
// and the socket to other uids.
std::shared_ptr<grpc::Channel> ChannelAs(const Daemon& d,
                                         const std::string& dir, uid_t uid) {
  REQUIRE(::chmod(dir.c_str(), 0711) == 0);
  REQUIRE(::chmod(d.socket().c_str(), 0666) == 0);
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (::syscall(SYS_setgroups, 0, nullptr) != 0 ||
        ::syscall(SYS_setresgid, uid, uid, uid) != 0 ||
        ::syscall(SYS_setresuid, uid, uid, uid) != 0) {
      ::_exit(2);
    }
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, d.socket().c_str(), sizeof(addr.sun_path) - 1);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ::_exit(3);
    }
    char byte = 0;
    iovec iov{&byte, 1};
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl;
    msg.msg_controllen = sizeof(ctl);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
    ::_exit(::sendmsg(sv[1], &msg, 0) == 1 ? 0 : 4);
  }
  ::close(sv[1]);
  REQUIRE(testing::WaitExit(pid) == 0);
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctl;
  msg.msg_controllen = sizeof(ctl);
  REQUIRE(::recvmsg(sv[0], &msg, 0) == 1);
  ::close(sv[0]);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  REQUIRE(c != nullptr);
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
  return grpc::CreateInsecureChannelFromFd("kregd", fd);
}

Client ClientAs(const Daemon& d, const std::string& dir, uid_t uid) {
  return Client(ChannelAs(d, dir, uid),
                d.socket() + " (as uid " + std::to_string(uid) + ")");
}

// Sends only the header of an upload of `size` bytes (no bytes follow).
grpc::Status AnnounceUpload(const std::shared_ptr<grpc::Channel>& channel,
                            const std::string& name, uint64_t size) {
  auto stub = v1::Registry::NewStub(channel);
  grpc::ClientContext ctx;
  v1::RegisterTargetResponse resp;
  auto writer = stub->RegisterTarget(&ctx, &resp);
  v1::RegisterTargetChunk chunk;
  v1::RegisterTargetHeader* h = chunk.mutable_header();
  h->set_target_name(name);
  h->set_func_name("Scale");
  h->set_platform("cpu");
  h->mutable_module()->set_upload_size(size);
  writer->Write(chunk);
  writer->WritesDone();
  return writer->Finish();
}

// Files in kregd's module store.
std::vector<std::string> StoreFiles(const Daemon& d) {
  std::vector<std::string> out;
  for (const auto& e :
       std::filesystem::directory_iterator(d.state_dir() + "/modules")) {
    out.push_back(e.path().filename().string());
  }
  return out;
}

TEST_CASE("content_id from another uid must match the module digest",
          "[integration][content_id]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  // uid 65534 registers its own module under content_id "build:1"...
  Client nobody = ClientAs(d, dir.path(), kNobody);
  RegisterRequest first = Upload(d, "demo", "libdemo_v2.so");
  first.content_id = "build:1";
  auto owned = nobody.Register(first);
  REQUIRE(owned.ok());
  CHECK(owned->target().audit().uid() == kNobody);
  // ... its own rebuild (other bytes, same content_id) is a no-op ...
  RegisterRequest rebuild = Upload(d, "demo");
  rebuild.content_id = "build:1";
  auto cached = nobody.Register(rebuild);
  REQUIRE(cached.ok());
  CHECK_FALSE(cached->created());
  // ... but root registering the real module under that claim is refused,
  // rather than handed uid 65534's code.
  RegisterError error;
  auto refused = d.client().Register(rebuild, &error);
  REQUIRE(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(Message(refused.status()),
             Catch::Contains("registered by uid 65534") &&
                 Catch::Contains(owned->target().module_digest()) &&
                 Catch::Contains("by uid 0 claims the same content_id") &&
                 Catch::Contains("\"build:1\""));
  REQUIRE(error.has_detail);
  CHECK(error.detail.existing_content_id() == "build:1");
  CHECK(error.detail.requested_content_id() == "build:1");
  // The owner's exact bytes are fine for anyone.
  auto same = d.client().Register(first);
  REQUIRE(same.ok());
  CHECK_FALSE(same->created());
  // Logged as a decision, with who asked.
  std::string log = d.log();
  CHECK_THAT(log, Catch::Contains("registration created: target \"demo\" "
                                  "(cpu) by uid 65534"));
  CHECK_THAT(log, Catch::Contains("registration no-op"));
  CHECK_THAT(log, Catch::Contains("registration refused (FAILED_PRECONDITION)"
                                  ": target \"demo\" (cpu) by uid 0 pid " +
                                  std::to_string(::getpid())));
}

TEST_CASE("Per-uid limits: registrations and store bytes, root exempt",
          "[integration][quota]") {
  TempDir dir;
  // Room for libdemo.so once, not twice (sanitized builds are larger).
  const uint64_t demo =
      ReadFile(testing::Runfile("kernels/cpu/libdemo.so")).size();
  const std::string limit = std::to_string(demo + demo / 2);
  Daemon d(dir.path(), {"--max-registrations-per-uid", "2",
                        "--max-store-bytes-per-uid", limit});
  d.Start();
  Client nobody = ClientAs(d, dir.path(), kNobody);
  REQUIRE(nobody.Register(Upload(d, "one")).ok());
  REQUIRE(nobody.Register(Upload(d, "two")).ok());  // same bytes: free
  auto third = nobody.Register(Upload(d, "three", "libdemo_v2.so"));
  REQUIRE(third.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(Message(third.status()),
             Catch::Contains("uid 65534 already has 2 registrations") &&
                 Catch::Contains("limit per uid is 2"));
  REQUIRE(nobody.Retire("two", "").ok());
  RegisterRequest big = Upload(d, "big");
  big.module_bytes.resize(2 * demo, '\0');
  auto too_big = nobody.Register(big);
  REQUIRE(too_big.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(Message(too_big.status()),
             Catch::Contains("uid 65534's module store use") &&
                 Catch::Contains("limit per uid is " + limit + " bytes"));
  // Checked before storing: only libdemo.so is in the store.
  CHECK(StoreFiles(d).size() == 1);
  // Root is exempt.
  CHECK(d.client().Register(big).ok());
  CHECK(d.client().Register(Upload(d, "r2", "libdemo_v2.so")).ok());
  CHECK(d.client().Register(Upload(d, "r3")).ok());
}

TEST_CASE("An upload past a per-uid quota is refused on its header",
          "[integration][quota]") {
  TempDir dir;
  const uint64_t demo =
      ReadFile(testing::Runfile("kernels/cpu/libdemo.so")).size();
  Daemon d(dir.path(),
           {"--max-store-bytes-per-uid", std::to_string(demo + demo / 2)});
  d.Start();
  auto channel = ChannelAs(d, dir.path(), kNobody);
  Client nobody(channel, "nobody");
  REQUIRE(nobody.Register(Upload(d, "one")).ok());
  // 64 MiB announced and never sent: refused for the quota, not for the
  // missing bytes, so the bytes would never have been read.
  grpc::Status big = AnnounceUpload(channel, "big", 64u << 20);
  CHECK(big.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK_THAT(big.error_message(),
             Catch::Contains("uid 65534's module store use") &&
                 Catch::Contains("max_store_bytes_per_uid"));
  CHECK_THAT(d.log(), Catch::Contains("registration refused "
                                      "(RESOURCE_EXHAUSTED): target \"big\""));
  // The size of a module the uid already holds may be that module again:
  // the header passes, and the (absent) bytes decide.
  grpc::Status same = AnnounceUpload(channel, "again", demo);
  CHECK(same.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(same.error_message(), Catch::Contains("but 0 arrived"));
  // A name that is already registered is never refused for a quota here.
  grpc::Status existing = AnnounceUpload(channel, "one", 64u << 20);
  CHECK(existing.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_CASE("kregctl retire: the name can be registered again, across restarts",
          "[integration][retire]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"--socket", d.socket()});
    return Kregctl(args);
  };
  REQUIRE(d.client().Register(Upload(d, "typo")).ok());
  RegisterRequest gpu = Upload(d, "typo");
  gpu.platform = "cuda";
  REQUIRE(d.client().Register(gpu).ok());
  auto retired = run({"retire", "typo", "--platform", "cpu"});
  CHECK(retired.exit_code == 0);
  CHECK_THAT(retired.out, Catch::StartsWith("retired typo (cpu) sha256:"));
  // New content under the name is accepted now; cuda is untouched.
  auto v2 = d.client().Register(Upload(d, "typo", "libdemo_v2.so"));
  REQUIRE(v2.ok());
  CHECK(v2->created());
  CHECK(d.client().Get("typo", "cuda").ok());
  REQUIRE(d.Stop() == 0);
  d.Start();
  // After a restart v2 holds the name and is protected as any name is.
  auto again = d.client().Register(Upload(d, "typo", "libdemo_v2.so"));
  REQUIRE(again.ok());
  CHECK_FALSE(again->created());
  CHECK(d.client().Register(Upload(d, "typo")).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(d.log(), Catch::Contains("retired target \"typo\" (cpu)"));

  auto missing = run({"retire", "never.registered"});
  CHECK(missing.exit_code == 1);
  CHECK_THAT(missing.err, Catch::Contains("\"never.registered\"") &&
                              Catch::Contains("no such target"));
  auto bad = run({"retire", "9bad"});
  CHECK(bad.exit_code == 2);
  auto bad_platform = run({"retire", "typo", "--platform", "quantum"});
  CHECK(bad_platform.exit_code == 2);
  CHECK_THAT(bad_platform.err, Catch::Contains("quantum"));
  // Another uid may not retire root's target.
  auto denied = ClientAs(d, dir.path(), kNobody).Retire("typo", "");
  REQUIRE(denied.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(Message(denied.status()),
             Catch::Contains("registered by uid 0") &&
                 Catch::Contains("you are uid 65534"));
  // Without --platform every platform goes.
  auto all = run({"retire", "typo"});
  CHECK(all.exit_code == 0);
  CHECK_THAT(all.out, Catch::Contains("retired typo (cpu)") &&
                          Catch::Contains("retired typo (cuda)"));
  CHECK(d.client().List()->empty());
}

TEST_CASE("kregctl gc removes unreferenced store files; admins only",
          "[integration][gc]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  REQUIRE(d.client().Register(Upload(d, "keep")).ok());
  REQUIRE(d.client().Register(Upload(d, "drop", "libdemo_v2.so")).ok());
  REQUIRE(StoreFiles(d).size() == 2);
  auto denied = ClientAs(d, dir.path(), kNobody).CollectGarbage();
  REQUIRE(denied.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(Message(denied.status()),
             Catch::Contains("root or kregd's own uid") &&
                 Catch::Contains("uid 65534 may not"));
  auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"--socket", d.socket()});
    return Kregctl(args);
  };
  auto nothing = run({"gc"});
  CHECK(nothing.exit_code == 0);
  CHECK_THAT(nothing.out, Catch::StartsWith("removed 0 files (0 bytes)"));
  // Retiring the last target of a module removes its file at once.
  REQUIRE(run({"retire", "drop"}).exit_code == 0);
  REQUIRE(StoreFiles(d).size() == 1);
  // A file nothing references (as a crash between a retirement's record
  // and the file's removal leaves one) is gc's.
  const std::string left = "left behind";
  {
    std::ofstream(
        d.state_dir() + "/modules/sha256-" + std::string(64, 'a') + ".so",
        std::ios::binary)
        << left;
  }
  auto gc = run({"gc"});
  CHECK(gc.exit_code == 0);
  CHECK_THAT(gc.out, Catch::StartsWith("removed 1 files (" +
                                       std::to_string(left.size()) +
                                       " bytes); kept 1 files"));
  REQUIRE(StoreFiles(d).size() == 1);
  // What is referenced still works, also after a restart.
  REQUIRE(d.Stop() == 0);
  d.Start();
  auto keep = d.client().Register(Upload(d, "keep"));
  REQUIRE(keep.ok());
  CHECK_FALSE(keep->created());
  CHECK(d.client().Status()->modules_loaded() == 1);
}

}  // namespace
}  // namespace kreg
