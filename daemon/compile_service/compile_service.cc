#include "daemon/compile_service/compile_service.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "daemon/base/log_limit.h"
#include "daemon/base/platform_table.h"
#include "daemon/compile_service/compile_worker.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

// The status message carries the diagnostics up to this many bytes (gRPC
// carries a status message in a header); the stream carries all of them.
constexpr size_t kMessageDiagnosticsBytes = 4096;

// kregd's arguments; the worker adds `-isystem` for the job's FFI headers.
std::vector<std::string> BaseArgs(Platform platform) {
  if (TraitsOf(platform).compiler == PlatformCompiler::kNvcc) {
    return {"-shared", "-Xcompiler", "-fPIC", "-O2", "-std=c++17", "-I."};
  }
  return {"-shared", "-fPIC", "-O2", "-std=c++17", "-I."};
}

std::string Excerpt(const std::string& diagnostics) {
  if (diagnostics.size() <= kMessageDiagnosticsBytes) return diagnostics;
  return absl::StrCat(diagnostics.substr(0, kMessageDiagnosticsBytes),
                      "\n[... ", diagnostics.size() - kMessageDiagnosticsBytes,
                      " more bytes in the diagnostics stream]");
}

std::chrono::milliseconds WorkerTimeout(const v1::CompileLimits& l) {
  // The worker kills the compiler at wall_s; kregd kills the worker a
  // little later.
  return std::chrono::milliseconds(
      static_cast<int64_t>((l.wall_s() + 15.0) * 1000.0));
}

}  // namespace

absl::StatusOr<v1::CompileJobResult> CompileService::RunWorker(
    const v1::CompileJob& job, std::chrono::milliseconds timeout,
    uint64_t max_module_bytes, const std::function<bool()>& cancelled) {
  if (options_.run_worker) {
    return options_.run_worker(job, timeout, max_module_bytes, cancelled);
  }
  return RunCompileWorker(options_.worker_binary, job, timeout,
                          max_module_bytes, cancelled);
}

void CompileService::Shutdown() {
  stopping_.store(true);
  absl::MutexLock lock(&mu_);  // wakes requests waiting for a slot
}

absl::Status CompileService::Enqueue(const Queued& q,
                                     const std::string& target) {
  const CompileQueueLimits& l = options_.queue;
  const UidQueue& u = uids_[q.uid];
  std::string full;
  if (u.queued + 1 > l.max_queued_per_uid) {
    full = absl::StrCat("uid ", q.uid, " already has ", u.queued,
                        " compile requests waiting, the limit "
                        "(compile_max_queued_per_uid)");
  } else if (u.bytes + q.bytes > l.max_queued_bytes_per_uid) {
    full = absl::StrCat("uid ", q.uid, "'s waiting compile requests hold ",
                        u.bytes, " bytes of sources and this one ", q.bytes,
                        ", over the limit of ", l.max_queued_bytes_per_uid,
                        " bytes (compile_max_queued_bytes_per_uid)");
  } else if (queued_ + 1 > l.max_queued) {
    full = absl::StrCat("kregd already has ", queued_,
                        " compile requests waiting, the limit "
                        "(compile_max_queued)");
  } else if (queued_bytes_ + q.bytes > l.max_queued_bytes) {
    full = absl::StrCat("kregd's waiting compile requests hold ", queued_bytes_,
                        " bytes of sources and this one ", q.bytes,
                        ", over the limit of ", l.max_queued_bytes,
                        " bytes (compile_max_queued_bytes)");
  }
  if (!full.empty()) {
    if (u.queued == 0 && u.running == 0 && u.waiting.empty()) {
      uids_.erase(q.uid);
    }
    queue_refusals_.fetch_add(1);
    return absl::ResourceExhaustedError(
        absl::StrCat("compile of target \"", target, "\" refused: ", full,
                     ". Compile again once earlier compiles are done, or "
                     "raise the limit in kregd's config"));
  }
  UidQueue& mine = uids_[q.uid];
  ++mine.queued;
  mine.bytes += q.bytes;
  ++queued_;
  queued_bytes_ += q.bytes;
  return absl::OkStatus();
}

void CompileService::Dequeue(const Queued& q) {
  UidQueue& u = uids_[q.uid];
  --u.queued;
  u.bytes -= q.bytes;
  --queued_;
  queued_bytes_ -= q.bytes;
  if (u.queued == 0 && u.running == 0 && u.waiting.empty()) uids_.erase(q.uid);
}

void CompileService::GrantSlots() {
  const int slots = std::max(1, options_.max_parallel);
  while (running_ < slots) {
    // The first uid after the last one served that has a request waiting
    // and a compile to spare, wrapping around.
    auto eligible = [this](const std::pair<const uid_t, UidQueue>& e) {
      return !e.second.waiting.empty() &&
             e.second.running < options_.queue.max_running_per_uid;
    };
    const auto after = uids_.upper_bound(last_served_);
    auto pick = std::find_if(after, uids_.end(), eligible);
    if (pick == uids_.end()) {
      pick = std::find_if(uids_.begin(), after, eligible);
      if (pick == after) return;
    }
    Queued* q = pick->second.waiting.front();
    pick->second.waiting.pop_front();
    q->granted = true;
    ++pick->second.running;
    ++running_;
    last_served_ = pick->first;
  }
}

CompileService::CompileService(Registrar* registrar, CompileCache* cache,
                               CompileOptions options)
    : registrar_(registrar), cache_(cache), options_(std::move(options)) {
  if (::geteuid() != 0) {
    spdlog::warn(
        "kregd is not root: compile workers run as kregd's uid {}, not as "
        "their callers', without their own mount and network namespaces "
        "(CPU, memory, output, process and wall-clock limits still apply)",
        ::geteuid());
  }
}

const std::string& CompileService::CompilerFor(Platform platform) const {
  return TraitsOf(platform).compiler == PlatformCompiler::kNvcc ? options_.nvcc
                                                                : options_.cxx;
}

absl::StatusOr<std::string> CompileService::Identity(Platform platform) {
  {
    absl::MutexLock lock(&mu_);
    auto it = identities_.find(platform);
    if (it != identities_.end()) return it->second;
  }
  const std::string& compiler = CompilerFor(platform);
  if (compiler.empty() || ::access(compiler.c_str(), X_OK) != 0) {
    if (TraitsOf(platform).compiler == PlatformCompiler::kNvcc) {
      return absl::FailedPreconditionError(absl::StrCat(
          "compiling for ", PlatformName(platform),
          " needs nvcc, which kregd did not find",
          compiler.empty() ? std::string(" (not on PATH nor in "
                                         "/usr/local/cuda/bin)")
                           : absl::StrCat(" at ", compiler),
          "; install the CUDA toolkit on kregd's host or set compile_nvcc in "
          "kregd's config"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "compiling for ", PlatformName(platform),
        " needs a C++ compiler; compile_cxx = \"", compiler,
        "\" is not an executable file; install g++ or set compile_cxx"));
  }
  v1::CompileJob job;
  job.set_identity_only(true);
  job.set_compiler(compiler);
  if (::geteuid() == 0) {  // nobody's rights suffice for --version
    job.set_drop_privileges(true);
    job.set_uid(65534);
    job.set_gid(65534);
  }
  KREG_ASSIGN_OR_RETURN(v1::CompileJobResult r,
                        RunWorker(job, std::chrono::seconds(60), 1,
                                  [this] { return stopping_.load(); }));
  if (r.code() != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the compiler's identity could not be read: ", r.message()));
  }
  std::string identity =
      absl::StrCat(r.identity(), "\n", absl::StrJoin(BaseArgs(platform), " "),
                   "\nXLA FFI headers ", options_.ffi_headers_digest);
  absl::MutexLock lock(&mu_);
  identities_[platform] = identity;
  std::vector<std::string> lines = absl::StrSplit(identity, '\n');
  spdlog::info("compile: {} compiler: {} ({})", PlatformName(platform),
               lines[0], lines.size() > 1 ? lines[1] : "");
  return identity;
}

absl::Status CompileService::Abandoned(const std::string& target, uid_t uid) {
  if (stopping_.load()) {
    return absl::CancelledError(
        "kregd is shutting down; compile again once kregd is back");
  }
  abandoned_.fetch_add(1);
  // A client can make this at will: rate-limited per uid.
  std::string suppressed;
  if (PeerLogLimiter().Allow(absl::StrCat("uid ", uid), &suppressed)) {
    spdlog::info(
        "compile of \"{}\" for uid {}: dropped, its caller went away "
        "(nobody else waits for it){}",
        target, uid, suppressed);
  }
  return absl::CancelledError(absl::StrCat("compile of target \"", target,
                                           "\" dropped: the caller went away"));
}

absl::Status CompileService::AcquireSlot(const CompileRequest& req,
                                         const PeerCred& peer,
                                         const std::function<bool()>& abandon) {
  Queued q{peer.uid, req.bytes, false};
  absl::MutexLock lock(&mu_);
  if (stopping_.load()) return Abandoned(req.target_name, peer.uid);
  UidQueue& u = uids_[peer.uid];
  // Waits (and counts as queued) unless a slot is free for it right now.
  const bool counted =
      !(running_ < std::max(1, options_.max_parallel) &&
        u.running < options_.queue.max_running_per_uid && u.waiting.empty());
  if (counted) {
    KREG_RETURN_IF_ERROR(Enqueue(q, req.target_name));
  }
  uids_[peer.uid].waiting.push_back(&q);
  GrantSlots();
  auto granted_or_stopping = [this, &q] {
    return q.granted || stopping_.load();
  };
  while (!q.granted && !stopping_.load() && !abandon()) {
    mu_.AwaitWithTimeout(absl::Condition(&granted_or_stopping),
                         absl::Seconds(1));
  }
  if (counted) Dequeue(q);
  if (q.granted && !stopping_.load()) return absl::OkStatus();
  if (q.granted) {
    --uids_[peer.uid].running;
    --running_;
  } else {
    std::deque<Queued*>& w = uids_[peer.uid].waiting;
    w.erase(std::find(w.begin(), w.end(), &q));
  }
  const UidQueue& left = uids_[peer.uid];
  if (left.queued == 0 && left.running == 0 && left.waiting.empty()) {
    uids_.erase(peer.uid);
  }
  GrantSlots();
  return Abandoned(req.target_name, peer.uid);
}

void CompileService::ReleaseSlot(uid_t uid) {
  absl::MutexLock lock(&mu_);
  UidQueue& u = uids_[uid];
  --u.running;
  --running_;
  if (u.queued == 0 && u.running == 0 && u.waiting.empty()) uids_.erase(uid);
  GrantSlots();
}

absl::StatusOr<std::string> CompileService::RunCompile(
    const CompileRequest& req, const PeerCred& peer, std::string* diagnostics,
    const std::function<bool()>& abandon) {
  KREG_RETURN_IF_ERROR(AcquireSlot(req, peer, abandon));
  v1::CompileJob job;
  job.set_compiler(CompilerFor(req.platform));
  for (std::string& a : BaseArgs(req.platform)) {
    job.add_base_args(std::move(a));
  }
  for (const v1::SourceFile& h : options_.ffi_headers)
    *job.add_ffi_headers() = h;
  for (const auto& [name, text] : req.sources) {
    v1::SourceFile* f = job.add_sources();
    f->set_name(name);
    f->set_text(text);
  }
  for (const auto& [name, text] : req.headers) {
    v1::SourceFile* f = job.add_headers();
    f->set_name(name);
    f->set_text(text);
  }
  for (const std::string& o : req.options) job.add_options(o);
  *job.mutable_limits() = options_.limits;
  if (::geteuid() == 0) {
    job.set_sandbox(true);
    job.set_drop_privileges(true);
    job.set_uid(peer.uid);
    job.set_gid(peer.gid);
    for (gid_t g : GroupsOf(peer.uid, peer.gid)) job.add_groups(g);
  }
  compiles_.fetch_add(1);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<v1::CompileJobResult> r =
      RunWorker(job, WorkerTimeout(job.limits()), job.limits().output_bytes(),
                [this, abandon] { return stopping_.load() || abandon(); });
  ReleaseSlot(peer.uid);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  if (!r.ok() && r.status().code() == absl::StatusCode::kCancelled) {
    return Abandoned(req.target_name, peer.uid);
  }
  if (!r.ok()) {
    spdlog::error("compile of \"{}\" for uid {}: {}", req.target_name, peer.uid,
                  std::string(r.status().message()));
    // Tagged "compile": kregd itself is up (a client must not read this
    // UNAVAILABLE as "kregd is not running").
    absl::Status failed(r.status().code(),
                        absl::StrCat("compile of target \"", req.target_name,
                                     "\": ", r.status().message()));
    failed.SetPayload(kCompileStagePayload, absl::Cord("compile"));
    return failed;
  }
  *diagnostics = r->diagnostics();
  spdlog::info("compile of \"{}\" ({}) for uid {} pid {}: {} in {:.2f} s ({})",
               req.target_name, PlatformName(req.platform), peer.uid, peer.pid,
               r->code() == 0 ? "done" : r->message(), secs, r->note());
  if (r->code() == 0) return std::move(*r->mutable_module());
  absl::Status failed = CompileFailure(req, *r);
  failed.SetPayload(kCompileStagePayload,
                    absl::Cord(r->limit().empty() ? "compile" : "limit"));
  return failed;
}

absl::Status CompileService::CompileFailure(
    const CompileRequest& req, const v1::CompileJobResult& result) {
  const v1::CompileJobResult* r = &result;
  const std::string named =
      absl::StrCat("compile of target \"", req.target_name, "\" (",
                   PlatformName(req.platform), ")");
  if (!r->limit().empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat(named, " stopped: ", r->message(), "; raise ", r->limit(),
                     " in kregd's config if the kernel needs more",
                     r->diagnostics().empty() ? "" : ". Compiler output:\n",
                     Excerpt(r->diagnostics())));
  }
  return absl::Status(
      static_cast<absl::StatusCode>(r->code()),
      absl::StrCat(named, " failed: ", r->message(),
                   r->diagnostics().empty() ? "" : ". Compiler output:\n",
                   Excerpt(r->diagnostics())));
}

absl::StatusOr<CompileOutcome> CompileService::Compile(
    const v1::CompileTargetRequest& request, const PeerCred& peer,
    const std::function<void(const std::string&)>& diagnostics,
    const std::function<bool()>& client_gone) {
  requests_.fetch_add(1);
  KREG_ASSIGN_OR_RETURN(CompileRequest req, ParseCompileRequest(request));
  KREG_ASSIGN_OR_RETURN(std::string identity, Identity(req.platform));
  const std::function<bool()> gone =
      client_gone ? client_gone : [] { return false; };
  CompileOutcome out;
  out.cache_key = CompileCacheKey(req, identity);
  // Builds are reused only for the caller's uid (CallerScopedKey).
  const std::string scoped = CallerScopedKey(out.cache_key, peer.uid);
  std::optional<std::string> module = cache_->Get(scoped);
  // This request leads the compile of its key and, in cluster mode, holds
  // the cluster's claim of it: it tells the peers how it ended.
  bool leader = false;
  int64_t claim = 0;
  if (module) {
    out.cache_hit = true;
    hits_.fetch_add(1);
  } else {
    std::shared_ptr<Flight> flight;
    const Queued waiting{peer.uid, req.bytes, false};
    {
      absl::MutexLock lock(&mu_);
      auto found = flights_.find(scoped);
      leader = found == flights_.end();
      if (leader) {
        flight =
            flights_.emplace(scoped, std::make_shared<Flight>()).first->second;
      } else {
        // Waiting for the compile in progress counts as queued.
        KREG_RETURN_IF_ERROR(Enqueue(waiting, req.target_name));
        flight = found->second;
        ++flight->waiters;
      }
    }
    if (leader) {
      // Another request may have finished this key since the lookup; in
      // cluster mode another host may have built it.
      std::optional<std::string> again = cache_->Get(scoped);
      if (!again && peers_ != nullptr) {
        again = peers_->Before(scoped, &claim);
        if (again) {
          out.from_peer = true;
          peer_fetches_.fetch_add(1);
          (void)cache_->Put(scoped, *again);
        }
      }
      absl::StatusOr<std::string> built = std::string();
      std::string diag;
      if (again) {
        built = *std::move(again);
        out.cache_hit = true;
        hits_.fetch_add(1);
      } else {
        // Given up only when this caller and every request waiting for
        // the compile went away.
        // By value: a worker runner may still ask after this call returns.
        built = RunCompile(req, peer, &diag, [gone, flight] {
          return flight->waiters.load() == 0 && gone();
        });
        if (built.ok()) {
          if (absl::Status s = cache_->Put(scoped, *built); !s.ok()) {
            spdlog::warn("compile cache: {}", std::string(s.message()));
          }
        }
      }
      absl::MutexLock lock(&mu_);
      flight->module = built;
      flight->diagnostics = diag;
      flight->done = true;
      flights_.erase(scoped);
    } else {
      waits_.fetch_add(1);
      out.waited = true;
      absl::MutexLock lock(&mu_);
      while (!flight->done && !gone()) {
        mu_.AwaitWithTimeout(absl::Condition(&flight->done), absl::Seconds(1));
      }
      --flight->waiters;
      Dequeue(waiting);
      if (!flight->done) {
        abandoned_.fetch_add(1);
        return absl::CancelledError(
            absl::StrCat("compile of target \"", req.target_name,
                         "\": the caller went away while it waited"));
      }
    }
    // Done: nobody writes the flight any more.
    out.diagnostics = flight->diagnostics;
    if (diagnostics && !out.diagnostics.empty()) diagnostics(out.diagnostics);
    if (!flight->module.ok()) {
      failures_.fetch_add(1);
      if (leader && peers_ != nullptr) peers_->Done(scoped, "", 0, claim);
      return flight->module.status();
    }
    module = *flight->module;
  }
  RegistrationRequest reg;
  reg.target_name = req.target_name;
  reg.func_name = req.func_name;
  reg.platform = PlatformName(req.platform);
  reg.content_id = req.content_id.empty() ? out.cache_key : req.content_id;
  reg.file_name = absl::StrCat("compiled from ", req.sources.front().first);
  reg.compiled = true;  // ParseCompileRequest checked the caller's content_id
  reg.replace = req.replace;
  reg.source = RegistrationRequest::Source::kUpload;
  reg.upload_size = module->size();
  reg.upload = *std::move(module);
  absl::StatusOr<RegisterOutcome> registered =
      registrar_->Register(std::move(reg), peer);
  if (leader && peers_ != nullptr) {
    // What this host now serves to the cluster's other hosts.
    if (registered.ok() && !out.from_peer) {
      peers_->Done(scoped, registered->entry->module_digest,
                   registered->entry->module_size, claim);
    } else {
      peers_->Done(scoped, "", 0, claim);
    }
  }
  if (!registered.ok()) {
    absl::Status st = registered.status();
    st.SetPayload(kCompileStagePayload, absl::Cord("registration"));
    return st;
  }
  out.registration = *std::move(registered);
  return out;
}

CompileCounts CompileService::counts() const {
  CompileCounts c;
  c.requests = requests_.load();
  c.compiles = compiles_.load();
  c.cache_hits = hits_.load();
  c.waits = waits_.load();
  c.failures = failures_.load();
  c.peer_fetches = peer_fetches_.load();
  c.abandoned = abandoned_.load();
  c.queue_refusals = queue_refusals_.load();
  return c;
}

}  // namespace kreg
