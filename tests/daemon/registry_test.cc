#include "daemon/registry.h"

#include <atomic>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "daemon/module_store.h"

namespace kreg {
namespace {

// In-memory HandlerLoader that counts loads.
class FakeLoader : public HandlerLoader {
 public:
  absl::Status Store(const std::string& bytes,
                     const std::string& digest) override {
    stored.push_back(digest);
    return digest == Sha256Digest(bytes)
               ? absl::OkStatus()
               : absl::InternalError("digest does not match the bytes");
  }
  std::vector<std::string> stored;
  absl::StatusOr<HandlerInfo> Probe(const std::string&,
                                    const std::string& func) override {
    if (func == "NotAHandler") {
      return absl::InvalidArgumentError("NotAHandler is not a handler");
    }
    return HandlerInfo{0, 4, 0, 0};
  }
  absl::Status Check(const std::string&) override {
    loads.fetch_add(1);
    return absl::OkStatus();
  }
  absl::Status CheckStored(const std::string& d) override {
    if (!stored_ok) return absl::DataLossError("store file is corrupt");
    return Check(d);
  }
  std::atomic<int> loads{0};
  bool stored_ok = true;
};

class MemLog : public RegistrationLog {
 public:
  absl::Status Append(const TargetEntry& e) override {
    if (fail) return absl::InternalError("disk full");
    entries.push_back(e);
    return absl::OkStatus();
  }
  std::vector<TargetEntry> entries;
  bool fail = false;
};

RegisterArgs Args(const std::string& name, const std::string& bytes,
                  const std::string& func = "Scale",
                  Platform platform = Platform::kCpu) {
  RegisterArgs a;
  a.key = {name, platform};
  a.func_name = func;
  a.module_bytes = bytes;
  a.origin = "upload";
  return a;
}

TEST_CASE("Register creates, then is an idempotent no-op", "[registry]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  auto first = registry.Register(Args("my_op", "aa"));
  REQUIRE(first.ok());
  CHECK(first->created);
  CHECK(first->entry->content_id == Sha256Digest("aa"));
  CHECK(first->entry->content_id.size() == 7 + 64);
  auto again = registry.Register(Args("my_op", "aa"));
  REQUIRE(again.ok());
  CHECK_FALSE(again->created);
  CHECK(loader.loads == 1);
  CHECK(log.entries.size() == 1);
  // Stored once, under the digest of its bytes; the no-op stores nothing.
  REQUIRE(loader.stored.size() == 1);
  CHECK(loader.stored[0] == Sha256Digest("aa"));
}

TEST_CASE("Register refuses new content under an existing name", "[registry]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  REQUIRE(registry.Register(Args("my_op", "aa")).ok());
  auto again = registry.Register(Args("my_op", "bb"));
  REQUIRE(again.status().code() == absl::StatusCode::kFailedPrecondition);
  std::string msg(again.status().message());
  CHECK_THAT(msg, Catch::Contains("\"my_op\""));
  CHECK_THAT(msg, Catch::Contains(Sha256Digest("aa")));
  CHECK_THAT(msg, Catch::Contains(Sha256Digest("bb")));
  CHECK_THAT(msg, Catch::Contains("distinct target name"));
  CHECK_THAT(msg, !Catch::Contains("replace=true"));
  CHECK(log.entries.size() == 1);
  CHECK(registry.refused() == 1);
}

TEST_CASE("Register refuses a different function under the same content",
          "[registry]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  REQUIRE(registry.Register(Args("my_op", "aa", "Scale")).ok());
  auto other = registry.Register(Args("my_op", "aa", "AddMul"));
  REQUIRE(other.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(other.status().message()),
             Catch::Contains("function \"AddMul\""));
}

TEST_CASE("replace=true is reserved: refused with its own message",
          "[registry]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  REQUIRE(registry.Register(Args("my_op", "aa")).ok());
  RegisterArgs change = Args("my_op", "bb");
  change.replace = true;
  auto refused = registry.Register(change);
  REQUIRE(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("replace=true was requested, but it is reserved"));
  RegisterArgs same = Args("my_op", "aa");
  same.replace = true;
  auto noop = registry.Register(same);
  REQUIRE(noop.ok());
  CHECK_FALSE(noop->created);
}

TEST_CASE("content_id decides identity when given", "[registry]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  RegisterArgs a = Args("op", "build-1 bytes");
  a.content_id = "cache:123";
  REQUIRE(registry.Register(a).ok());
  RegisterArgs rebuilt = Args("op", "build-2 bytes differ");
  rebuilt.content_id = "cache:123";
  auto same = registry.Register(rebuilt);
  REQUIRE(same.ok());
  CHECK_FALSE(same->created);
  rebuilt.content_id = "cache:456";
  auto changed = registry.Register(rebuilt);
  CHECK(changed.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(changed.status().message()),
             Catch::Contains("cache:123") && Catch::Contains("cache:456"));
}

TEST_CASE("One name carries a CPU and a CUDA implementation", "[registry]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  REQUIRE(registry.Register(Args("op", "cpu", "Scale", Platform::kCpu)).ok());
  auto cuda = registry.Register(Args("op", "gpu", "Scale", Platform::kCuda));
  REQUIRE(cuda.ok());
  CHECK(cuda->created);
  CHECK(registry.Find("op").size() == 2);
}

TEST_CASE("A probe failure registers nothing", "[registry]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  auto bad = registry.Register(Args("op", "aa", "NotAHandler"));
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(registry.Lookup({"op", Platform::kCpu}) == nullptr);
  CHECK(log.entries.empty());
}

TEST_CASE("A journal failure registers nothing", "[registry]") {
  FakeLoader loader;
  MemLog log;
  log.fail = true;
  Registry registry(&loader, &log);
  auto st = registry.Register(Args("op", "aa"));
  CHECK(st.status().code() == absl::StatusCode::kInternal);
  CHECK(registry.Lookup({"op", Platform::kCpu}) == nullptr);
}

TEST_CASE("N concurrent identical registrations load once", "[registry]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  std::atomic<int> ok{0}, created{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 32; ++i) {
    threads.emplace_back([&] {
      auto r = registry.Register(Args("op", "aa"));
      if (r.ok()) ok++;
      if (r.ok() && r->created) created++;
    });
  }
  for (auto& t : threads) t.join();
  CHECK(ok == 32);
  CHECK(created == 1);
  CHECK(loader.loads == 1);
  CHECK(log.entries.size() == 1);
}

TEST_CASE("N concurrent conflicting registrations have one winner",
          "[registry]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  std::atomic<int> ok{0}, refused{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 32; ++i) {
    threads.emplace_back([&, i] {
      auto r = registry.Register(Args("op", "content-" + std::to_string(i)));
      if (r.ok()) ok++;
      if (r.status().code() == absl::StatusCode::kFailedPrecondition) {
        refused++;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(ok == 1);
  CHECK(refused == 31);
  CHECK(log.entries.size() == 1);
}

TEST_CASE("Restore keeps a name with a corrupt module reserved", "[registry]") {
  FakeLoader loader;
  MemLog log;
  loader.stored_ok = false;
  Registry registry(&loader, &log);
  TargetEntry e;
  e.key = {"op", Platform::kCpu};
  e.func_name = "Scale";
  e.content_id = Sha256Digest("aa");
  e.module_digest = Sha256Digest("aa");
  CHECK(registry.Restore(e).code() == absl::StatusCode::kDataLoss);
  EntryPtr kept = registry.Lookup(e.key);
  REQUIRE(kept != nullptr);
  CHECK_THAT(kept->unavailable, Catch::Contains("corrupt"));
  // Other content is still refused; the original bytes repair it.
  CHECK(registry.Register(Args("op", "bb")).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  auto repaired = registry.Register(Args("op", "aa"));
  REQUIRE(repaired.ok());
  CHECK(repaired->entry->unavailable.empty());
  CHECK(log.entries.empty());
}

TEST_CASE("Restore refuses a second journaled record re-pointing a name",
          "[registry]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  TargetEntry e;
  e.key = {"op", Platform::kCpu};
  e.func_name = "Scale";
  e.content_id = e.module_digest = Sha256Digest("aa");
  REQUIRE(registry.Restore(e).ok());
  TargetEntry other = e;
  other.content_id = other.module_digest = Sha256Digest("bb");
  CHECK(registry.Restore(other).code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(registry.Lookup(e.key)->content_id == Sha256Digest("aa"));
}

RegisterArgs InProcess(const std::string& name, const std::string& cid) {
  RegisterArgs a;
  a.key = {name, Platform::kCuda};
  a.func_name = "my_kernel";
  a.content_id = cid;
  a.kind = TargetKind::kInProcess;
  a.origin = "in-process:pid 7";
  a.peer = {1000, 1000, 7};
  return a;
}

TEST_CASE("In-process targets: idempotent, refused on change, nothing loaded",
          "[registry]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  auto first = registry.Register(InProcess("numba.k", "fp:1"));
  REQUIRE(first.ok());
  CHECK(first->created);
  CHECK(first->entry->kind == TargetKind::kInProcess);
  CHECK(first->entry->module_digest.empty());
  CHECK(first->entry->registered_by.pid == 7);
  auto again = registry.Register(InProcess("numba.k", "fp:1"));
  REQUIRE(again.ok());
  CHECK_FALSE(again->created);
  auto changed = registry.Register(InProcess("numba.k", "fp:2"));
  REQUIRE(changed.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(changed.status().message()),
             Catch::Contains("in-process content fp:1") &&
                 Catch::Contains("in-process content fp:2"));
  CHECK(loader.loads == 0);
  CHECK(log.entries.size() == 1);
}

TEST_CASE("A module cannot take over an in-process name, nor the reverse",
          "[registry]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  REQUIRE(registry.Register(InProcess("k", "fp:1")).ok());
  RegisterArgs module = Args("k", "bytes", "my_kernel", Platform::kCuda);
  module.content_id = "fp:1";
  CHECK(registry.Register(module).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  REQUIRE(registry.Register(Args("m", "bytes")).ok());
  RegisterArgs taken = InProcess("m", Sha256Digest("bytes"));
  taken.key.platform = Platform::kCpu;
  taken.func_name = "Scale";
  CHECK(registry.Register(taken).status().code() ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("Restore brings back in-process targets without loading",
          "[registry]") {
  FakeLoader loader;
  MemLog log;
  Registry registry(&loader, &log);
  TargetEntry e;
  e.key = {"k", Platform::kCuda};
  e.kind = TargetKind::kInProcess;
  e.func_name = "my_kernel";
  e.content_id = "fp:1";
  REQUIRE(registry.Restore(e).ok());
  CHECK(loader.loads == 0);
  CHECK(registry.Register(InProcess("k", "fp:2")).status().code() ==
        absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kreg
