// The compile service (DESIGN §13, docs/user-guide.md "Compile once"):
// checks a CompileTarget request, computes its cache key, answers from the
// compile cache (or, in cluster mode, a peer) or compiles in a sandboxed
// kregd-compile worker as the caller, then registers the module through the
// Registrar with content_id = the cache key, so DESIGN §2's rules apply
// unchanged. Concurrent requests for one key share one compile; different
// keys compile in parallel up to max_parallel, at most max_running_per_uid
// of one uid. Requests waiting for a compile are bounded (per uid and in
// all, by count and by bytes of sources: CompileQueueLimits) and get the
// free slots round-robin by uid; a waiting request whose caller went away
// leaves the queue, and a compile that nobody waits for any more is
// stopped.
//
// Thread-safe. The registrar and cache must outlive it.
#ifndef KREGD_DAEMON_COMPILE_SERVICE_COMPILE_SERVICE_H_
#define KREGD_DAEMON_COMPILE_SERVICE_COMPILE_SERVICE_H_

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/compile_service/compile_cache.h"
#include "daemon/compile_service/compile_request.h"
#include "daemon/registry/registrar.h"
#include "kreg/v1/compile.pb.h"

namespace kreg {

// The payload (absl::Status::GetPayload) saying which step a Compile error
// came from: "compile" (the sources do not compile), "limit" (a compile
// limit stopped it) or "registration" (the Registrar refused the result).
inline constexpr char kCompileStagePayload[] = "kreg.dev/compile-stage";

// The compile queue's bounds (docs/operator-guide.md "The compile service").
// A request is queued from the moment it must wait (for a slot, or for
// the compile of the same sources in progress) until its compile starts
// or ends; its sources and headers are its bytes.
struct CompileQueueLimits {
  int max_running_per_uid = 2;               // compile_max_running_per_uid
  int max_queued = 128;                      // compile_max_queued
  int max_queued_per_uid = 32;               // compile_max_queued_per_uid
  uint64_t max_queued_bytes = 256ull << 20;  // compile_max_queued_bytes
  uint64_t max_queued_bytes_per_uid = 64ull << 20;  // ..._bytes_per_uid
};

struct CompileOptions {
  std::string worker_binary;  // kregd-compile
  std::string cxx;            // g++ for cpu
  std::string nvcc;           // nvcc for cuda; empty: none found
  // The XLA FFI headers every compile gets (LoadFfiHeaders), and their
  // digest, part of each compiler identity and so of every cache key.
  std::vector<v1::SourceFile> ffi_headers;
  std::string ffi_headers_digest;
  v1::CompileLimits limits;
  int max_parallel = 1;
  CompileQueueLimits queue;
  // Runs one job (tests fake it); unset: RunCompileWorker(worker_binary).
  // `cancelled` says when to give up (kregd is stopping, or nobody waits
  // for the compile any more).
  std::function<absl::StatusOr<v1::CompileJobResult>(
      const v1::CompileJob& job, std::chrono::milliseconds timeout,
      uint64_t max_module_bytes, const std::function<bool()>& cancelled)>
      run_worker;
};

// The other hosts of a cluster (DESIGN §10, §13); see daemon/kregd/compile_part.cc.
class CompilePeers {
 public:
  virtual ~CompilePeers() = default;
  // Before this host compiles `key`: the module another host built for it
  // (verified against the digest the cluster records), or nullopt when this
  // host is to compile it. Sets `*claim` when this host claimed the key.
  virtual std::optional<std::string> Before(const std::string& key,
                                            int64_t* claim) = 0;
  // After: the module this host registered for `key` (`digest` empty when
  // none: the compile or its registration failed); ends `claim`.
  virtual void Done(const std::string& key, const std::string& digest,
                    uint64_t size, int64_t claim) = 0;
};

struct CompileOutcome {
  RegisterOutcome registration;
  std::string cache_key;
  bool cache_hit = false;  // no compile ran for this request
  bool waited = false;     // it shared another request's compile
  bool from_peer = false;  // a cluster peer had the module
  std::string diagnostics;
};

struct CompileCounts {
  uint64_t requests = 0;
  uint64_t compiles = 0;  // kregd_compiles_total
  uint64_t cache_hits = 0;
  uint64_t waits = 0;
  uint64_t failures = 0;
  uint64_t peer_fetches = 0;    // modules a cluster peer had built
  uint64_t abandoned = 0;       // requests whose caller went away first
  uint64_t queue_refusals = 0;  // RESOURCE_EXHAUSTED by CompileQueueLimits
};

class CompileService {
 public:
  CompileService(Registrar* registrar, CompileCache* cache,
                 CompileOptions options);
  CompileService(const CompileService&) = delete;
  CompileService& operator=(const CompileService&) = delete;

  // Cluster mode: asks `peers` (which must outlive this) for a key before
  // compiling it.
  void set_peers(CompilePeers* peers) { peers_ = peers; }

  // Compiles (or finds) and registers. Errors: ParseCompileRequest's;
  // FAILED_PRECONDITION when the platform's compiler is missing (naming
  // it); INVALID_ARGUMENT for a compile error and RESOURCE_EXHAUSTED for a
  // limit, both with the diagnostics in the message; the Registrar's.
  // `diagnostics` (may be null) receives the compiler's output once the
  // compile is done, also when it failed. RESOURCE_EXHAUSTED naming the
  // key when the queue (CompileQueueLimits) has no room for the request.
  // `client_gone` (may be null; asked about once a second while the
  // request waits or its compile runs) says the caller went away: CANCELLED.
  absl::StatusOr<CompileOutcome> Compile(
      const v1::CompileTargetRequest& request, const PeerCred& peer,
      const std::function<void(const std::string&)>& diagnostics,
      const std::function<bool()>& client_gone = nullptr);

  // kregd is stopping: running compiles are stopped (their workers killed
  // within a second) and later or waiting ones fail with CANCELLED, so the
  // gRPC server's shutdown does not wait for a long compile.
  void Shutdown();

  CompileCounts counts() const;
  CompileCache* cache() { return cache_; }

 private:
  // One compile that concurrent requests for its key share.
  struct Flight {
    bool done = false;
    std::atomic<int> waiters{0};  // other requests waiting for it
    absl::StatusOr<std::string> module = std::string();
    std::string diagnostics;
  };

  absl::StatusOr<std::string> Identity(Platform platform);
  // options_.cxx or options_.nvcc, as `platform`'s row says
  // (daemon/base/platform_table.h).
  const std::string& CompilerFor(Platform platform) const;
  // The caller's error for a compile that failed or hit a limit.
  static absl::Status CompileFailure(const CompileRequest& req,
                                     const v1::CompileJobResult& r);
  absl::StatusOr<v1::CompileJobResult> RunWorker(
      const v1::CompileJob& job, std::chrono::milliseconds timeout,
      uint64_t max_module_bytes, const std::function<bool()>& cancelled);

  // One request in the queue: its uid and bytes; `granted` once it may
  // compile.
  struct Queued {
    uid_t uid = 0;
    uint64_t bytes = 0;
    bool granted = false;
  };
  // What one uid has queued and running.
  struct UidQueue {
    std::deque<Queued*> waiting;  // for a slot, first come first
    int running = 0;
    int queued = 0;  // waiting for a slot or for a compile of its key
    uint64_t bytes = 0;
  };
  // Counts `q` as queued; RESOURCE_EXHAUSTED naming the limit when there is
  // no room (nothing counted then).
  absl::Status Enqueue(const Queued& q, const std::string& target)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Dequeue(const Queued& q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands free slots to waiting requests, one uid after the other.
  void GrantSlots() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for a slot for `req` (queued unless one is free for it now).
  // `abandon` says to give up: CANCELLED.
  absl::Status AcquireSlot(const CompileRequest& req, const PeerCred& peer,
                           const std::function<bool()>& abandon);
  void ReleaseSlot(uid_t uid);
  // Why a request that gave up waiting did: kregd stops, or its caller left.
  absl::Status Abandoned(const std::string& target, uid_t uid);
  // Runs the worker for `req` as `peer` (waiting for a slot) until
  // `abandon` says to give up.
  absl::StatusOr<std::string> RunCompile(const CompileRequest& req,
                                         const PeerCred& peer,
                                         std::string* diagnostics,
                                         const std::function<bool()>& abandon);

  Registrar* const registrar_;
  CompileCache* const cache_;
  const CompileOptions options_;
  CompilePeers* peers_ = nullptr;

  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Flight>> flights_ ABSL_GUARDED_BY(mu_);
  std::map<Platform, std::string> identities_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uid_t, UidQueue> uids_ ABSL_GUARDED_BY(mu_);
  int queued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uid_t last_served_ ABSL_GUARDED_BY(mu_) = 0;  // GrantSlots' round robin
  std::atomic<bool> stopping_{false};

  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> compiles_{0};
  std::atomic<uint64_t> hits_{0};
  std::atomic<uint64_t> waits_{0};
  std::atomic<uint64_t> failures_{0};
  std::atomic<uint64_t> peer_fetches_{0};
  std::atomic<uint64_t> abandoned_{0};
  std::atomic<uint64_t> queue_refusals_{0};
};

}  // namespace kreg

#endif  // KREGD_DAEMON_COMPILE_SERVICE_COMPILE_SERVICE_H_
