#include "daemon/compile_service/compile_service.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "tests/daemon/registry/registry_fakes.h"
#include "tests/testing/temp_dir.h"

namespace kreg {
namespace {

// A worker that "compiles" a module from the job's first source text,
// counting runs and the most that ran at once. A source text starting
// with "bad" fails like a compile error, "huge" like a limit.
struct FakeWorker {
  absl::StatusOr<v1::CompileJobResult> Run(const v1::CompileJob& job) {
    v1::CompileJobResult r;
    if (job.identity_only()) {
      r.set_identity("fake g++ 1.0");
      return r;
    }
    if (!fail_with.ok()) return fail_with;
    const int now = ++running;
    int seen = max_running.load();
    while (now > seen && !max_running.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    --running;
    ++runs;
    last_uid = job.uid();
    {
      std::lock_guard<std::mutex> lock(cancelled_mu);
      uids.push_back(job.uid());
    }
    const std::string& text = job.sources(0).text();
    if (text.rfind("bad", 0) == 0) {
      r.set_code(3);
      r.set_message("the compiler failed (exit status 1)");
      r.set_diagnostics("k.cc:1:1: error: bad\n");
    } else if (text.rfind("huge", 0) == 0) {
      r.set_code(8);
      r.set_limit("compile_memory_bytes");
      r.set_message(
          "it hit the memory limit of 1 bytes (compile_memory_bytes)");
    } else {
      r.set_module(
          "\x7f"
          "ELF " +
          text);
      r.set_diagnostics("k.cc:1: warning: fine\n");
    }
    return r;
  }
  std::atomic<int> runs{0}, running{0}, max_running{0};
  std::atomic<uint32_t> last_uid{0};
  int delay_ms = 100;
  absl::Status fail_with;  // set: every compile job fails with it
  // The last job's cancellation check (jobs run on several threads).
  std::mutex cancelled_mu;
  std::function<bool()> cancelled;
  std::vector<uint32_t> uids;  // of the jobs run, in order (cancelled_mu)
};

struct Fixture {
  explicit Fixture(int max_parallel = 2, CompileQueueLimits queue = {})
      : registry(&loader, &log),
        registrar(&registry, ModulePolicy{}),
        cache(dir.path() + "/compile", 0) {
    REQUIRE(cache.Init().ok());
    CompileOptions o;
    o.cxx = "/bin/true";  // Identity wants an executable
    o.max_parallel = max_parallel;
    o.queue = queue;
    o.limits.set_output_bytes(1 << 20);
    o.limits.set_wall_s(10);
    o.run_worker = [this](const v1::CompileJob& job, std::chrono::milliseconds,
                          uint64_t, const std::function<bool()>& cancelled) {
      {
        std::lock_guard<std::mutex> lock(worker.cancelled_mu);
        worker.cancelled = cancelled;
      }
      return worker.Run(job);
    };
    service = std::make_unique<CompileService>(&registrar, &cache, o);
  }
  absl::StatusOr<CompileOutcome> Compile(
      const std::string& name, const std::string& text,
      PeerCred peer = PeerCred{1000, 1000, 42},
      const std::function<bool()>& gone = nullptr) {
    v1::CompileTargetRequest r;
    r.set_target_name(name);
    r.set_func_name("Scale");
    r.set_platform("cpu");
    v1::SourceFile* f = r.add_sources();
    f->set_name("k.cc");
    f->set_text(text);
    return service->Compile(r, peer, nullptr, gone);
  }
  testing::TempDir dir;
  FakeLoader loader;
  MemLog log;
  Registry registry;
  Registrar registrar;
  CompileCache cache;
  FakeWorker worker;
  std::unique_ptr<CompileService> service;
};

TEST_CASE("Concurrent requests for one key share one compile", "[compile]") {
  Fixture f;
  std::vector<std::thread> threads;
  std::vector<absl::StatusOr<CompileOutcome>> out(8, absl::UnknownError(""));
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] { out[i] = f.Compile("cc.one", "int x;"); });
  }
  for (std::thread& t : threads) t.join();
  CHECK(f.worker.runs == 1);
  int created = 0;
  for (const auto& o : out) {
    REQUIRE(o.ok());
    CHECK(o->cache_key == out[0]->cache_key);
    CHECK(o->registration.entry->content_id == o->cache_key);
    created += o->registration.created;
  }
  CHECK(created == 1);
  CompileCounts c = f.service->counts();
  CHECK(c.requests == 8);
  CHECK(c.compiles == 1);
  CHECK(c.waits + c.cache_hits == 7);
}

TEST_CASE("Different keys compile in parallel up to max_parallel",
          "[compile]") {
  Fixture f(2);
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};  // Catch2 asserts on this thread only
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&f, &ok, i] {
      ok += f.Compile("cc.p" + std::to_string(i),
                      "int x" + std::to_string(i) + ";")
                .ok();
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(ok == 6);
  CHECK(f.worker.runs == 6);
  CHECK(f.worker.max_running == 2);
}

TEST_CASE("A cached key is a hit; the compiler runs as the caller",
          "[compile]") {
  Fixture f;
  REQUIRE(f.Compile("cc.a", "int y;").ok());
  absl::StatusOr<CompileOutcome> again = f.Compile("cc.a", "int y;");
  REQUIRE(again.ok());
  CHECK(again->cache_hit);
  CHECK_FALSE(again->registration.created);
  CHECK(f.worker.runs == 1);
  if (::geteuid() == 0) CHECK(f.worker.last_uid == 1000);
}

TEST_CASE(
    "A changed source under a registered name is refused at "
    "registration",
    "[compile]") {
  Fixture f;
  REQUIRE(f.Compile("cc.c", "int a;").ok());
  absl::StatusOr<CompileOutcome> changed = f.Compile("cc.c", "int b;");
  REQUIRE_FALSE(changed.ok());
  CHECK(changed.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(changed.status().message()).find("distinct target name") !=
        std::string::npos);
  CHECK(changed.status().GetPayload(kCompileStagePayload) ==
        absl::Cord("registration"));
}

TEST_CASE("A failed compile is not cached and carries the diagnostics",
          "[compile]") {
  Fixture f;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<CompileOutcome> bad = f.Compile("cc.bad", "bad code");
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
    std::string msg(bad.status().message());
    CHECK(msg.find("compile of target \"cc.bad\" (cpu) failed") !=
          std::string::npos);
    CHECK(msg.find("k.cc:1:1: error: bad") != std::string::npos);
    CHECK(bad.status().GetPayload(kCompileStagePayload) ==
          absl::Cord("compile"));
  }
  CHECK(f.worker.runs == 2);
  CHECK(f.service->counts().failures == 2);
}

TEST_CASE("A worker that fails is a compile error, not kregd's absence",
          "[compile]") {
  Fixture f;
  f.worker.fail_with = absl::UnavailableError("the compile worker died");
  absl::StatusOr<CompileOutcome> r = f.Compile("cc.died", "int d;");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(r.status().message()) ==
        "compile of target \"cc.died\": the compile worker died");
  CHECK(r.status().GetPayload(kCompileStagePayload) == absl::Cord("compile"));
}

TEST_CASE("Shutdown stops waiting and later compiles with CANCELLED",
          "[compile]") {
  Fixture f(1);
  f.worker.delay_ms = 300;
  absl::StatusOr<CompileOutcome> first = absl::UnknownError("");
  std::thread running([&] { first = f.Compile("cc.s1", "int s1;"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  absl::StatusOr<CompileOutcome> queued = absl::UnknownError("");
  std::thread waiting([&] { queued = f.Compile("cc.s2", "int s2;"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  f.service->Shutdown();
  running.join();
  waiting.join();
  std::function<bool()> cancelled;
  {
    std::lock_guard<std::mutex> lock(f.worker.cancelled_mu);
    cancelled = f.worker.cancelled;
  }
  REQUIRE(cancelled);
  CHECK(cancelled());
  CHECK(first.ok());  // the fake worker ignores cancellation
  REQUIRE_FALSE(queued.ok());
  CHECK(queued.status().code() == absl::StatusCode::kCancelled);
  CHECK(std::string(queued.status().message()).find("shutting down") !=
        std::string::npos);
  CHECK(f.Compile("cc.s3", "int s3;").status().code() ==
        absl::StatusCode::kCancelled);
}

TEST_CASE("A limit names its key", "[compile]") {
  Fixture f;
  absl::StatusOr<CompileOutcome> r = f.Compile("cc.huge", "huge");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(r.status().message())
            .find("raise compile_memory_bytes in kregd's config") !=
        std::string::npos);
  CHECK(r.status().GetPayload(kCompileStagePayload) == absl::Cord("limit"));
}

TEST_CASE("cuda without nvcc is FAILED_PRECONDITION naming nvcc", "[compile]") {
  Fixture f;
  v1::CompileTargetRequest r;
  r.set_target_name("cc.cu");
  r.set_func_name("K");
  r.set_platform("cuda");
  v1::SourceFile* s = r.add_sources();
  s->set_name("k.cu");
  absl::StatusOr<CompileOutcome> out =
      f.service->Compile(r, PeerCred{0, 0, 1}, nullptr);
  REQUIRE_FALSE(out.ok());
  CHECK(out.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(out.status().message()).find("needs nvcc") !=
        std::string::npos);
  CHECK(f.worker.runs == 0);
}

struct FakePeers : CompilePeers {
  std::optional<std::string> Before(const std::string&,
                                    int64_t* claim) override {
    ++asked;
    if (have)
      return std::string(
          "\x7f"
          "ELF from a peer");
    *claim = 7;
    return std::nullopt;
  }
  void Done(const std::string&, const std::string& digest, uint64_t,
            int64_t claim) override {
    done_digest = digest;
    done_claim = claim;
  }
  bool have = false;
  int asked = 0;
  std::string done_digest;
  int64_t done_claim = 0;
};

TEST_CASE("In a cluster a peer's module is used instead of a compile",
          "[compile]") {
  Fixture f;
  FakePeers peers;
  f.service->set_peers(&peers);
  peers.have = true;
  absl::StatusOr<CompileOutcome> got = f.Compile("cc.peer", "int p;");
  REQUIRE(got.ok());
  CHECK(got->cache_hit);
  CHECK(got->from_peer);
  CHECK(f.worker.runs == 0);
  CHECK(f.service->counts().peer_fetches == 1);
  CHECK(peers.done_digest.empty());  // nothing new to tell the cluster
  // A key no peer has: compiled here, then recorded with its digest and
  // the claim ended.
  peers.have = false;
  absl::StatusOr<CompileOutcome> built = f.Compile("cc.peer2", "int q;");
  REQUIRE(built.ok());
  CHECK(f.worker.runs == 1);
  CHECK(peers.done_digest == built->registration.entry->module_digest);
  CHECK(peers.done_claim == 7);
}

TEST_CASE("Bad requests are refused before the compiler's identity is read",
          "[compile]") {
  Fixture f;
  absl::StatusOr<CompileOutcome> r = f.Compile("9bad", "int x;");
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(f.worker.runs == 0);
}

// Starts f.Compile on a thread and gives it time to queue.
std::thread Later(Fixture& f, absl::StatusOr<CompileOutcome>* out,
                  const std::string& name, const std::string& text,
                  uid_t uid = 1000,
                  const std::function<bool()>& gone = nullptr) {
  std::thread t([&f, out, name, text, uid, gone] {
    *out = f.Compile(name, text, PeerCred{uid, uid, 42}, gone);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  return t;
}

TEST_CASE("Free compiles go round-robin by uid, not first come", "[compile]") {
  Fixture f(1);
  f.worker.delay_ms = 600;
  std::vector<absl::StatusOr<CompileOutcome>> out(4, absl::UnknownError(""));
  std::vector<std::thread> t;
  t.push_back(Later(f, &out[0], "cc.r0", "int r0;", 1000));
  t.push_back(Later(f, &out[1], "cc.r1", "int r1;", 1000));
  t.push_back(Later(f, &out[2], "cc.r2", "int r2;", 1000));
  t.push_back(Later(f, &out[3], "cc.r3", "int r3;", 2000));
  for (std::thread& th : t) th.join();
  for (const auto& o : out) CHECK(o.ok());
  CHECK(f.worker.uids == std::vector<uint32_t>{1000, 2000, 1000, 1000});
}

TEST_CASE("The queue is bounded per uid and in all, by count and bytes",
          "[compile]") {
  CompileQueueLimits q;
  q.max_queued_per_uid = 1;
  q.max_queued = 2;
  q.max_queued_bytes_per_uid = 100;
  q.max_queued_bytes = 1000;
  Fixture f(1, q);
  f.worker.delay_ms = 1500;
  absl::StatusOr<CompileOutcome> running = absl::UnknownError("");
  absl::StatusOr<CompileOutcome> queued = absl::UnknownError("");
  absl::StatusOr<CompileOutcome> other = absl::UnknownError("");
  std::thread a = Later(f, &running, "cc.b0", "int b0;");  // runs at once
  // Over uid 2000's bytes: refused, nothing counted.
  absl::StatusOr<CompileOutcome> big =
      f.Compile("cc.big", std::string(200, 'x'), PeerCred{2000, 2000, 1});
  std::thread b = Later(f, &queued, "cc.b1", "int b1;");
  absl::StatusOr<CompileOutcome> second = f.Compile("cc.b2", "int b2;");
  std::thread c = Later(f, &other, "cc.b3", "int b3;", 3000);
  absl::StatusOr<CompileOutcome> third =
      f.Compile("cc.b4", "int b4;", PeerCred{4000, 4000, 1});
  a.join();
  b.join();
  c.join();
  REQUIRE_FALSE(big.ok());
  CHECK(big.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(big.status().message()) ==
        "compile of target \"cc.big\" refused: uid 2000's waiting compile "
        "requests hold 0 bytes of sources and this one 204, over the limit "
        "of 100 bytes (compile_max_queued_bytes_per_uid). Compile again once "
        "earlier compiles are done, or raise the limit in kregd's config");
  REQUIRE_FALSE(second.ok());
  CHECK(std::string(second.status().message())
            .find("uid 1000 already has 1 compile requests waiting, the limit "
                  "(compile_max_queued_per_uid)") != std::string::npos);
  REQUIRE_FALSE(third.ok());
  CHECK(std::string(third.status().message())
            .find("kregd already has 2 compile requests waiting, the limit "
                  "(compile_max_queued)") != std::string::npos);
  CHECK(running.ok());
  CHECK(queued.ok());
  CHECK(other.ok());
  CHECK(f.worker.runs == 3);
  CHECK(f.service->counts().queue_refusals == 3);
}

TEST_CASE("A caller that went away is dropped from the queue", "[compile]") {
  Fixture f(1);
  f.worker.delay_ms = 3000;
  std::atomic<bool> gone{false};
  absl::StatusOr<CompileOutcome> running = absl::UnknownError("");
  absl::StatusOr<CompileOutcome> dropped = absl::UnknownError("");
  std::thread a = Later(f, &running, "cc.d0", "int d0;");
  std::thread b = Later(f, &dropped, "cc.d1", "int d1;", 1000,
                        [&gone] { return gone.load(); });
  gone = true;
  b.join();  // within about a second, while cc.d0 still compiles
  CHECK(f.worker.runs == 0);
  a.join();
  REQUIRE_FALSE(dropped.ok());
  CHECK(dropped.status().code() == absl::StatusCode::kCancelled);
  CHECK(std::string(dropped.status().message()) ==
        "compile of target \"cc.d1\" dropped: the caller went away");
  CHECK(f.worker.runs == 1);
  CHECK(f.service->counts().abandoned == 1);
}

TEST_CASE("A compile is cancelled only when every caller waiting went away",
          "[compile]") {
  Fixture f(1);
  f.worker.delay_ms = 2000;
  std::atomic<bool> leader_gone{false}, follower_gone{false};
  absl::StatusOr<CompileOutcome> leader = absl::UnknownError("");
  absl::StatusOr<CompileOutcome> follower = absl::UnknownError("");
  std::thread a = Later(f, &leader, "cc.c0", "int c0;", 1000,
                        [&] { return leader_gone.load(); });
  std::thread b = Later(f, &follower, "cc.c0", "int c0;", 1000,
                        [&] { return follower_gone.load(); });
  std::function<bool()> cancelled;
  {
    std::lock_guard<std::mutex> lock(f.worker.cancelled_mu);
    cancelled = f.worker.cancelled;
  }
  REQUIRE(cancelled);
  leader_gone = true;
  CHECK_FALSE(cancelled());  // the follower still waits for it
  follower_gone = true;
  b.join();
  CHECK(cancelled());  // nobody waits: the worker is stopped
  a.join();
}

}  // namespace
}  // namespace kreg
