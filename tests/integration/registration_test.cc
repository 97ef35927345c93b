// Drives the real kregd binary over real gRPC (kreg::Client) and through
// kregctl: DESIGN §2 rules, persistence and every invalid input.
#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <set>
#include <thread>

#include "catch2/catch.hpp"
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

// Files in kregd's module store.
std::vector<std::string> StoreFiles(const Daemon& d) {
  std::vector<std::string> out;
  for (const auto& e :
       std::filesystem::directory_iterator(d.state_dir() + "/modules")) {
    out.push_back(e.path().filename().string());
  }
  return out;
}

TEST_CASE("Re-registering identical content is a no-op", "[integration]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  Client c = d.client();
  auto first = c.Register(Upload(d, "demo.scale"));
  REQUIRE(first.ok());
  CHECK(first->created());
  CHECK(first->target().content_id().rfind("sha256:", 0) == 0);
  CHECK(first->target().content_id().size() == 7 + 64);
  CHECK(first->target().audit().pid() == ::getpid());
  CHECK(first->target().audit().uid() == ::getuid());
  CHECK(first->target().ffi_api_minor() == 4);
  auto again = c.Register(Upload(d, "demo.scale"));
  REQUIRE(again.ok());
  CHECK_FALSE(again->created());
  auto status = c.Status();
  REQUIRE(status.ok());
  CHECK(status->modules_loaded() == 1);
  CHECK(status->targets() == 1);
}

TEST_CASE("A 256 MiB module uploads in chunks and loads", "[integration]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  // An ELF loader ignores bytes past the sections, so padding a real module
  // gives a loadable 256 MiB library.
  RegisterRequest big = Upload(d, "big.module");
  big.module_bytes.resize(256u << 20, '\0');
  auto r = d.client().Register(big);
  REQUIRE(r.ok());
  CHECK(r->created());
  CHECK(r->target().module_size() == (256u << 20));
  CHECK(r->target().audit().origin() == "upload:268435456 bytes");
}

TEST_CASE("In-process targets are registered, listed and persisted",
          "[integration]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  RegisterRequest r;
  r.target_name = "numba.kernel";
  r.func_name = "my_kernel";
  r.platform = "cuda";
  r.content_id = "numba:abc";
  r.in_process = true;
  auto first = d.client().Register(r);
  REQUIRE(first.ok());
  CHECK(first->created());
  CHECK(first->target().kind() == "in-process");
  CHECK(first->target().audit().pid() == ::getpid());
  CHECK(first->target().audit().origin() ==
        "in-process:pid " + std::to_string(::getpid()));
  RegisterRequest no_cid = r;
  no_cid.content_id.clear();
  auto missing = d.client().Register(no_cid);
  CHECK(missing.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(Message(missing.status()), Catch::Contains("needs a content_id"));
  REQUIRE(d.Stop() == 0);
  d.Start();
  auto again = d.client().Register(r);
  REQUIRE(again.ok());
  CHECK_FALSE(again->created());
  r.content_id = "numba:changed";
  auto changed = d.client().Register(r);
  CHECK(changed.status().code() == absl::StatusCode::kFailedPrecondition);
  auto list = Kregctl({"--socket", d.socket(), "list"});
  CHECK_THAT(list.out,
             Catch::Contains("numba.kernel") && Catch::Contains("in-process"));
  CHECK(d.client().Status()->modules_loaded() == 0);
}

TEST_CASE("Changed content is refused, with and without replace",
          "[integration]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  Client c = d.client();
  REQUIRE(c.Register(Upload(d, "demo.scale")).ok());
  RegisterError error;
  auto refused = c.Register(Upload(d, "demo.scale", "libdemo_v2.so"), &error);
  REQUIRE(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(
      Message(refused.status()),
      Catch::Contains("demo.scale") && Catch::Contains("distinct target name"));
  REQUIRE(error.has_detail);
  CHECK(error.detail.target_name() == "demo.scale");
  CHECK(error.detail.platform() == "cpu");
  CHECK(error.detail.existing_func_name() == "Scale");
  CHECK(error.detail.existing_content_id().rfind("sha256:", 0) == 0);
  CHECK_FALSE(error.detail.replace_requested());

  RegisterRequest replace = Upload(d, "demo.scale", "libdemo_v2.so");
  replace.replace = true;
  auto with_replace = c.Register(replace, &error);
  REQUIRE(with_replace.status().code() ==
          absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(Message(with_replace.status()),
             Catch::Contains("replace=true was requested"));
  CHECK(error.detail.replace_requested());

  RegisterRequest same = Upload(d, "demo.scale");
  same.replace = true;
  auto noop = c.Register(same);
  REQUIRE(noop.ok());
  CHECK_FALSE(noop->created());
  CHECK(c.Status()->registrations_refused() == 2);
}

TEST_CASE("content_id: equal is a no-op, changed is refused", "[integration]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  Client c = d.client();
  RegisterRequest a = Upload(d, "op");
  a.content_id = "build:1";
  REQUIRE(c.Register(a).ok());
  RegisterRequest rebuilt = Upload(d, "op", "libdemo_v2.so");
  rebuilt.content_id = "build:1";
  auto same = c.Register(rebuilt);
  REQUIRE(same.ok());
  CHECK_FALSE(same->created());
  rebuilt.content_id = "build:2";
  auto changed = c.Register(rebuilt);
  CHECK(changed.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(Message(changed.status()),
             Catch::Contains("build:1") && Catch::Contains("build:2"));
}

TEST_CASE("One name on cpu and cuda", "[integration]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  Client c = d.client();
  REQUIRE(c.Register(Upload(d, "op")).ok());
  RegisterRequest cuda = Upload(d, "op", "libdemo_v2.so");
  cuda.platform = "GPU";
  auto r = c.Register(cuda);
  REQUIRE(r.ok());
  CHECK(r->created());
  CHECK(r->target().platform() == "cuda");
  auto both = c.Get("op", "");
  REQUIRE(both.ok());
  CHECK(both->size() == 2);
  auto only_cuda = c.Get("op", "cuda");
  REQUIRE(only_cuda.ok());
  REQUIRE(only_cuda->size() == 1);
  CHECK((*only_cuda)[0].content_id() == r->target().content_id());
}

TEST_CASE("Registration storms from threads: one load, one winner",
          "[integration]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  std::atomic<int> ok{0}, created{0}, refused{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      Client c = d.client();
      auto same = c.Register(Upload(d, "storm.same"));
      if (same.ok()) ok++;
      if (same.ok() && same->created()) created++;
      RegisterRequest conflicting = Upload(d, "storm.conflict");
      conflicting.content_id = "content-" + std::to_string(i);
      auto r = c.Register(conflicting);
      if (r.status().code() == absl::StatusCode::kFailedPrecondition) {
        refused++;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(ok == 16);
  CHECK(created == 1);
  CHECK(refused == 15);
  CHECK(d.client().Status()->modules_loaded() == 1);
}

// The probe hangs until the test opens a gate (libhang_ctor.so waits for
// $KREG_TEST_HANG_UNTIL), under a probe limit no loaded machine reaches, so
// "the others finished while it hung" does not depend on the machine's speed.
TEST_CASE("A probe that hangs holds back no other name", "[integration]") {
  TempDir dir;
  const std::string gate = dir.path() + "/gate";
  const std::string config = dir.path() + "/kregd.toml";
  testing::WriteFile(config, "probe_timeout_s = 3600\n");
  ::setenv("KREG_TEST_HANG_UNTIL", gate.c_str(), 1);
  Daemon d(dir.path(), {"--config", config});
  d.Start();
  ::unsetenv("KREG_TEST_HANG_UNTIL");
  std::atomic<bool> slow_done{false};
  absl::Status slow;
  std::thread hung([&] {
    slow =
        d.client().Register(Upload(d, "slow.hang", "libhang_ctor.so")).status();
    slow_done = true;
  });
  // kregd's probe child is inside the constructor once it has said so.
  for (int i = 0; i < 3000 &&
                  d.log().find("libhang_ctor.so: hanging") == std::string::npos;
       ++i) {
    ::usleep(20000);
  }
  REQUIRE_THAT(d.log(), Catch::Contains("libhang_ctor.so: hanging"));
  Client c = d.client();
  std::atomic<int64_t> slowest_us{0};
  std::atomic<int> created{0};
  std::vector<std::thread> fast;
  for (int i = 0; i < 10; ++i) {
    fast.emplace_back([&, i] {
      auto start = std::chrono::steady_clock::now();
      auto r = d.client().Register(Upload(d, "fast." + std::to_string(i)));
      const int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(
                             std::chrono::steady_clock::now() - start)
                             .count();
      int64_t seen = slowest_us.load();
      while (us > seen && !slowest_us.compare_exchange_weak(seen, us)) {
      }
      created += r.ok() && r->created();
    });
  }
  for (std::thread& t : fast) t.join();
  CHECK(created == 10);
  CHECK(c.List()->size() == 10);
  REQUIRE(c.Retire("fast.0", "").ok());
  // All of that happened while the probe was still hanging.
  CHECK_FALSE(slow_done);
  std::printf("while a probe hung: 10 registrations, the slowest %.1f ms\n",
              slowest_us.load() / 1000.0);
  testing::WriteFile(gate, "");
  hung.join();
  CHECK(slow.ok());
  CHECK(c.List()->size() == 10);
}

TEST_CASE("A probe that outlasts probe_timeout_s is killed and refused",
          "[integration]") {
  TempDir dir;
  const std::string config = dir.path() + "/kregd.toml";
  testing::WriteFile(config, "probe_timeout_s = 2\n");
  Daemon d(dir.path(), {"--config", config});
  d.Start();
  absl::Status slow =
      d.client().Register(Upload(d, "slow.hang", "libhang_ctor.so")).status();
  CHECK(slow.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(Message(slow),
             Catch::Contains("did not finish within 2 s (probe_timeout_s)"));
  CHECK(d.client().List()->empty());
}

TEST_CASE("Registration storms from processes: one winner", "[integration]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  std::vector<testing::CommandResult> same(6), conflict(6);
  std::vector<std::thread> threads;
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] {
      same[i] =
          Kregctl({"--socket", d.socket(), "register", "proc.same", "--module",
                   d.Kernel("libdemo.so"), "--function", "Scale"});
      conflict[i] =
          Kregctl({"--socket", d.socket(), "register", "proc.conflict",
                   "--module", d.Kernel("libdemo.so"), "--function", "Scale",
                   "--content-id", "c" + std::to_string(i)});
    });
  }
  for (auto& t : threads) t.join();
  int created = 0, winners = 0, refusals = 0;
  for (int i = 0; i < 6; ++i) {
    CHECK(same[i].exit_code == 0);
    if (same[i].out.rfind("registered ", 0) == 0) created++;
    if (conflict[i].exit_code == 0) winners++;
    if (conflict[i].exit_code == 3) {
      refusals++;
      CHECK_THAT(conflict[i].err, Catch::Contains("proc.conflict"));
    }
  }
  CHECK(created == 1);
  CHECK(winners == 1);
  CHECK(refusals == 5);
}

TEST_CASE("A refused re-point stays refused after restart", "[integration]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  REQUIRE(d.client().Register(Upload(d, "persist")).ok());
  CHECK(d.Stop() == 0);
  d.Start();
  auto listed = d.client().List();
  REQUIRE(listed.ok());
  REQUIRE(listed->size() == 1);
  CHECK((*listed)[0].audit().pid() == ::getpid());
  auto refused = d.client().Register(Upload(d, "persist", "libdemo_v2.so"));
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  auto same = d.client().Register(Upload(d, "persist"));
  REQUIRE(same.ok());
  CHECK_FALSE(same->created());
}

TEST_CASE("kill -9 during a storm loses no acknowledged registration",
          "[integration]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  std::mutex mu;
  std::set<std::string> acked;
  std::atomic<bool> go{true};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      Client c = d.client();
      for (int i = 0; go && i < 1000; ++i) {
        std::string name = "k" + std::to_string(t) + "_" + std::to_string(i);
        if (c.Register(Upload(d, name)).ok()) {
          std::lock_guard<std::mutex> lock(mu);
          acked.insert(name);
        }
      }
    });
  }
  while (true) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::lock_guard<std::mutex> lock(mu);
    if (acked.size() >= 20) break;
  }
  d.Kill();
  go = false;
  for (auto& t : threads) t.join();
  d.Start();
  auto listed = d.client().List();
  REQUIRE(listed.ok());
  std::set<std::string> present;
  for (const auto& t : *listed) present.insert(t.target_name());
  for (const std::string& name : acked) {
    INFO(name);
    CHECK(present.count(name) == 1);
  }
  CHECK(acked.size() >= 20);
}

TEST_CASE("A torn journal tail is ignored at start-up", "[integration]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  Client c = d.client();
  REQUIRE(c.Register(Upload(d, "first")).ok());
  REQUIRE(c.Register(Upload(d, "second")).ok());
  REQUIRE(d.Stop() == 0);
  std::string journal = d.state_dir() + "/journal";
  std::string data = ReadFile(journal);
  testing::WriteFile(journal, data.substr(0, data.size() - 3));
  d.Start();
  auto listed = d.client().List();
  REQUIRE(listed.ok());
  REQUIRE(listed->size() == 1);
  CHECK((*listed)[0].target_name() == "first");
  CHECK_THAT(d.log(), Catch::Contains("torn last record"));
}

TEST_CASE("A corrupt store file keeps the name reserved", "[integration]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  auto r = d.client().Register(Upload(d, "stored"));
  REQUIRE(r.ok());
  REQUIRE(d.Stop() == 0);
  std::string hex = r->target().module_digest().substr(7);
  std::string path = d.state_dir() + "/modules/sha256-" + hex + ".so";
  ::chmod(path.c_str(), 0600);
  std::string bytes = ReadFile(path);
  bytes[bytes.size() / 2] ^= 0x01;
  testing::WriteFile(path, bytes);
  d.Start();
  CHECK_THAT(d.log(), Catch::Contains("corrupt") && Catch::Contains(hex));
  auto listed = d.client().List();
  REQUIRE(listed.ok());
  CHECK(listed->size() == 1);
  auto other = d.client().Register(Upload(d, "stored", "libdemo_v2.so"));
  CHECK(other.status().code() == absl::StatusCode::kFailedPrecondition);
  auto repaired = d.client().Register(Upload(d, "stored"));
  REQUIRE(repaired.ok());
  CHECK_FALSE(repaired->created());
  CHECK(ReadFile(path) == ReadFile(d.Kernel("libdemo.so")));
}

TEST_CASE("Invalid inputs are refused with clear messages", "[integration]") {
  TempDir dir;
  // Above the kernels' size also when built with --config=asan (~3 MB).
  Daemon d(dir.path(), {"--max-module-bytes", "8000000"});
  d.Start();
  Client c = d.client();
  auto expect = [&](RegisterRequest req, absl::StatusCode code,
                    const std::string& text) {
    auto r = c.Register(req);
    INFO(req.target_name << " / " << req.func_name << " / " << req.platform);
    CHECK(r.status().code() == code);
    CHECK_THAT(Message(r.status()), Catch::Contains(text));
  };
  for (const char* bad : {"9x", "", "a b", "x/y", "é"}) {
    expect(Upload(d, bad), absl::StatusCode::kInvalidArgument, "target name");
  }
  expect(Upload(d, std::string(300, 'a')), absl::StatusCode::kInvalidArgument,
         "300 characters");
  RegisterRequest rocm = Upload(d, "op");
  rocm.platform = "rocm";
  expect(rocm, absl::StatusCode::kUnimplemented, "\"rocm\"");
  RegisterRequest weird = Upload(d, "op");
  weird.platform = "quantum";
  expect(weird, absl::StatusCode::kInvalidArgument,
         "unknown platform \"quantum\"");
  expect(Upload(d, "op", "libdemo.so", "NoSuchSymbol"),
         absl::StatusCode::kInvalidArgument, "no symbol \"NoSuchSymbol\"");
  expect(Upload(d, "op", "libdemo.so", "bad-symbol"),
         absl::StatusCode::kInvalidArgument, "not a C symbol name");
  RegisterRequest not_elf = Upload(d, "op");
  not_elf.module_bytes = "#include <stdio.h>\n";
  expect(not_elf, absl::StatusCode::kInvalidArgument,
         "not an ELF shared library");
  expect(Upload(d, "op", "libnot_handler.so", "NotAHandler"),
         absl::StatusCode::kInvalidArgument, "not an XLA FFI handler");
  expect(Upload(d, "op", "libnot_handler.so", "plain_function"),
         absl::StatusCode::kInvalidArgument, "crashed the probe helper");
  expect(Upload(d, "op", "libcrash_ctor.so", "Scale"),
         absl::StatusCode::kInvalidArgument, "crashed the probe helper");
  expect(Upload(d, "op", "libnewer_api.so", "NewerApi"),
         absl::StatusCode::kInvalidArgument, "API 0.99, newer than the 0.4");
  expect(Upload(d, "op", "libstateful.so", "Stateful"),
         absl::StatusCode::kInvalidArgument,
         "an instantiate-stage handler: register it as the instantiate stage");
  RegisterRequest big = Upload(d, "op");
  big.module_bytes = std::string(9000000, '\x7f');
  expect(big, absl::StatusCode::kInvalidArgument,
         "uploaded module is 9000000 bytes; the limit is 8000000 "
         "(max_module_bytes)");
  RegisterRequest bad_cid = Upload(d, "op");
  bad_cid.content_id = "has space";
  expect(bad_cid, absl::StatusCode::kInvalidArgument, "content_id");
  RegisterRequest spoof = Upload(d, "op");
  spoof.content_id = "sha256:" + std::string(64, 'a');
  expect(spoof, absl::StatusCode::kInvalidArgument,
         "content_id \"sha256:" + std::string(64, 'a') +
             "\" has the form of a module digest but the module's digest is "
             "sha256:");
  // Nothing above registered anything, loaded a module or left a file in
  // the store (also after a restart).
  CHECK(c.List()->empty());
  CHECK(c.Status()->modules_loaded() == 0);
  CHECK(StoreFiles(d).empty());
  // The daemon is still healthy after the crashing probes.
  CHECK(c.Health().ok());
  // Each refusal is logged with who asked and why, at the edge and in the
  // registry.
  const std::string pid = std::to_string(::getpid());
  CHECK_THAT(d.log(),
             Catch::Contains("registration refused (INVALID_ARGUMENT): target "
                             "\"9x\" (\"cpu\") by uid 0 pid " +
                             pid + ": target name"));
  CHECK_THAT(d.log(),
             Catch::Contains("registration refused (INVALID_ARGUMENT): "
                             "target \"op\" (cpu) by uid 0 pid " +
                             pid + ": module sha256:"));
  REQUIRE(d.Stop() == 0);
  d.Start();
  CHECK(StoreFiles(d).empty());
  CHECK(d.client().List()->empty());
}

TEST_CASE("Daemon-side paths: allowed roots, traversal, symlink escape",
          "[integration]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  Client c = d.client();
  std::string outside = dir.path() + "/outside";
  std::filesystem::create_directories(outside);
  testing::WriteFile(outside + "/libevil.so", ReadFile(d.Kernel("libdemo.so")));
  std::filesystem::create_symlink(outside + "/libevil.so",
                                  d.modules_dir() + "/link.so");
  auto by_path = [&](const std::string& path) {
    RegisterRequest r;
    r.target_name = "p";
    r.func_name = "Scale";
    r.daemon_path = path;
    return c.Register(r);
  };
  auto ok = by_path(d.Kernel("libdemo.so"));
  REQUIRE(ok.ok());
  CHECK(ok->target().audit().origin() == "path:" + d.Kernel("libdemo.so"));
  for (const std::string& escape :
       {outside + "/libevil.so", d.modules_dir() + "/../outside/libevil.so",
        d.modules_dir() + "/link.so"}) {
    auto r = by_path(escape);
    INFO(escape);
    CHECK(r.status().code() == absl::StatusCode::kPermissionDenied);
    CHECK_THAT(Message(r.status()), Catch::Contains("outside the daemon's "
                                                    "allowed roots"));
  }
  auto relative = by_path("libdemo.so");
  CHECK(relative.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(Message(relative.status()), Catch::Contains("not absolute"));
  auto missing = by_path(d.modules_dir() + "/absent.so");
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(Message(missing.status()), Catch::Contains("absent.so"));
  auto directory = by_path(d.modules_dir());
  CHECK(directory.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(Message(directory.status()), Catch::Contains("not a regular"));
}

TEST_CASE("kregctl: exit codes and messages", "[integration][kregctl]") {
  TempDir dir;
  Daemon d(dir.path());
  d.Start();
  std::vector<std::string> base = {"--socket", d.socket()};
  auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), base.begin(), base.end());
    return Kregctl(args);
  };
  auto reg = run({"register", "cli.op", "--module", d.Kernel("libdemo.so"),
                  "--function", "Scale"});
  CHECK(reg.exit_code == 0);
  CHECK_THAT(reg.out, Catch::StartsWith("registered cli.op (cpu) sha256:"));
  auto again = run({"register", "cli.op", "--module", d.Kernel("libdemo.so"),
                    "--function", "Scale"});
  CHECK(again.exit_code == 0);
  CHECK_THAT(again.out, Catch::StartsWith("already registered cli.op"));
  auto refused = run({"register", "cli.op", "--module",
                      d.Kernel("libdemo_v2.so"), "--function", "Scale"});
  CHECK(refused.exit_code == 3);
  CHECK_THAT(refused.err, Catch::Contains("distinct target name"));
  auto invalid = run({"register", "9bad", "--module", d.Kernel("libdemo.so"),
                      "--function", "Scale"});
  CHECK(invalid.exit_code == 2);
  CHECK_THAT(invalid.err, Catch::Contains("\"9bad\""));
  auto usage = run({"register", "x"});
  CHECK(usage.exit_code == 2);
  auto list = run({"list"});
  CHECK(list.exit_code == 0);
  CHECK_THAT(list.out, Catch::Contains("NAME") && Catch::Contains("cli.op"));
  auto json = run({"list", "--json"});
  CHECK(json.exit_code == 0);
  CHECK_THAT(json.out, Catch::Contains("\"target_name\": \"cli.op\""));
  auto show = run({"show", "cli.op", "--platform", "cpu"});
  CHECK(show.exit_code == 0);
  CHECK_THAT(show.out, Catch::Contains("func_name: Scale") &&
                           Catch::Contains("origin: upload:"));
  auto missing = run({"show", "nope"});
  CHECK(missing.exit_code == 1);
  CHECK_THAT(missing.err, Catch::Contains("no target \"nope\""));
  auto status = run({"status", "--json"});
  CHECK(status.exit_code == 0);
  CHECK_THAT(status.out, Catch::Contains("\"targets\": 1") &&
                             Catch::Contains("\"registrations_refused\": 1"));
  auto health = run({"health"});
  CHECK(health.exit_code == 0);
  CHECK(health.out == "SERVING\n");
  REQUIRE(d.Stop() == 0);
  auto down = run({"list"});
  CHECK(down.exit_code == 4);
  CHECK_THAT(down.err, Catch::Contains("cannot reach kregd at " + d.socket()));
}

TEST_CASE("Daemon start-up errors are clear", "[integration]") {
  TempDir dir, other;
  Daemon d(dir.path());
  d.Start();
  std::string kregd = testing::Runfile("daemon/kregd/kregd");
  auto same_state = testing::Run({kregd, "--socket", other.path() + "/s.sock",
                                  "--state-dir", d.state_dir()});
  CHECK(same_state.exit_code == 1);
  CHECK_THAT(same_state.err, Catch::Contains("in use by another kregd"));
  auto same_socket = testing::Run(
      {kregd, "--socket", d.socket(), "--state-dir", other.path() + "/state"});
  CHECK(same_socket.exit_code == 1);
  CHECK_THAT(
      same_socket.err,
      Catch::Contains("another daemon is already serving " + d.socket()));
  auto bad_root = testing::Run({kregd, "--allow-root", "/no/such/dir"});
  CHECK(bad_root.exit_code == 2);
  CHECK_THAT(bad_root.err, Catch::Contains("\"/no/such/dir\" does not exist"));
  testing::WriteFile(other.path() + "/group.toml",
                     "socket_group = \"no-such-group-kreg\"\n");
  auto bad_group = testing::Run(
      {kregd, "--config", other.path() + "/group.toml", "--socket",
       other.path() + "/g.sock", "--state-dir", other.path() + "/gstate"});
  CHECK(bad_group.exit_code == 2);
  CHECK_THAT(bad_group.err,
             Catch::Contains("socket_group \"no-such-group-kreg\" "
                             "(--socket-group or the config file) does not "
                             "exist"));
  auto bad_flag = testing::Run({kregd, "--no-such-flag"});
  CHECK(bad_flag.exit_code == 2);
  CHECK_THAT(bad_flag.err, Catch::Contains("--no-such-flag"));
  testing::WriteFile(other.path() + "/bad.toml", "socket = 5\n");
  auto bad_toml = testing::Run({kregd, "--config", other.path() + "/bad.toml"});
  CHECK(bad_toml.exit_code == 2);
  CHECK_THAT(bad_toml.err, Catch::Contains("key \"socket\" must be a string"));
  testing::WriteFile(other.path() + "/unknown.toml", "sockett = \"x\"\n");
  auto unknown =
      testing::Run({kregd, "--config", other.path() + "/unknown.toml"});
  CHECK(unknown.exit_code == 2);
  CHECK_THAT(unknown.err, Catch::Contains("unknown key \"sockett\" (did "
                                          "you mean \"socket\"? known: "
                                          "socket, state_dir,"));
  testing::WriteFile(other.path() + "/far.toml", "zzzzzzzz = 1\n");
  auto far = testing::Run({kregd, "--config", other.path() + "/far.toml"});
  CHECK(far.exit_code == 2);
  CHECK_THAT(far.err, Catch::Contains("unknown key \"zzzzzzzz\" (known: "));
  auto missing =
      testing::Run({kregd, "--config", other.path() + "/no-such-config.toml"});
  CHECK(missing.exit_code == 2);
  CHECK_THAT(missing.err,
             Catch::Contains("config file " + other.path() +
                             "/no-such-config.toml cannot be read: No such "
                             "file or directory"));
  // The first daemon is unaffected, and a clean stop removes its socket.
  CHECK(d.client().Health().ok());
  CHECK(d.Stop() == 0);
  CHECK_FALSE(std::filesystem::exists(d.socket()));
}

TEST_CASE("A TOML config file sets socket, state and roots", "[integration]") {
  TempDir dir;
  std::string kregd = testing::Runfile("daemon/kregd/kregd");
  std::filesystem::create_directories(dir.path() + "/root");
  testing::WriteFile(dir.path() + "/root/libdemo.so",
                     ReadFile(testing::Runfile("kernels/cpu/libdemo.so")));
  testing::WriteFile(dir.path() + "/kregd.toml",
                     "socket = \"" + dir.path() +
                         "/c.sock\"\n"
                         "state_dir = \"" +
                         dir.path() +
                         "/st\"\n"
                         "allowed_roots = [\"" +
                         dir.path() + "/root\"]\n" + "socket_group = \"" +
                         ::getgrgid(::getgid())->gr_name + "\"\n");
  pid_t pid = testing::Spawn({kregd, "--config", dir.path() + "/kregd.toml"},
                             "/dev/null", dir.path() + "/log");
  REQUIRE(pid > 0);
  Client c(dir.path() + "/c.sock");
  bool healthy = false;
  for (int i = 0; i < 400 && !healthy; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    healthy = c.Health().ok();
  }
  REQUIRE(healthy);
  RegisterRequest r;
  r.target_name = "cfg";
  r.func_name = "Scale";
  r.daemon_path = dir.path() + "/root/libdemo.so";
  CHECK(c.Register(r).ok());
  auto status = c.Status();
  REQUIRE(status.ok());
  CHECK(status->state_dir() == dir.path() + "/st");
  CHECK(std::filesystem::exists(dir.path() + "/st/journal"));
  for (const char* sock : {"/c.sock", "/c.sock.session"}) {
    struct stat st;
    REQUIRE(::stat((dir.path() + sock).c_str(), &st) == 0);
    CHECK(st.st_gid == ::getgid());
    CHECK((st.st_mode & 0777) == 0660);
  }
  ::kill(pid, SIGTERM);
  CHECK(testing::WaitExit(pid) == 0);
}

}  // namespace
}  // namespace kreg
