// kregd's compile part (parts.h, DESIGN §13).
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "daemon/base/sha256.h"
#include "daemon/cluster/cluster_registry.h"
#include "daemon/compile_service/compile_cache.h"
#include "daemon/compile_service/compile_service.h"
#include "daemon/kregd/parts.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

// The XLA FFI headers compiles use, read once: compile_ffi_include_dir, else
// those kregd was built against, shipped beside it (the build tree's
// <bin>/daemon/kregd/include, a package's /usr/share/kregd/include). They
// travel in each job, so a compile needs no host path visible in its sandbox.
absl::Status LoadFfiHeaders(const Config& config, CompileOptions* opts) {
  std::vector<std::string> tried;
  if (!config.compile_ffi_include_dir.empty()) {
    tried.push_back(config.compile_ffi_include_dir);
  } else {
    tried = {SelfDir() + "/include", SelfDir() + "/../share/kregd/include"};
  }
  for (const std::string& root : tried) {
    const std::string dir = root + "/xla/ffi/api";
    if (::access((dir + "/ffi.h").c_str(), R_OK) != 0) continue;
    std::vector<std::string> names;
    if (DIR* d = ::opendir(dir.c_str())) {
      while (dirent* e = ::readdir(d)) {
        if (absl::EndsWith(e->d_name, ".h")) names.push_back(e->d_name);
      }
      ::closedir(d);
    }
    std::sort(names.begin(), names.end());
    std::string hashed;
    for (const std::string& name : names) {
      std::ifstream in(dir + "/" + name, std::ios::binary);
      std::string text((std::istreambuf_iterator<char>(in)), {});
      if (!in.good() && !in.eof()) {
        return absl::FailedPreconditionError(
            absl::StrCat("cannot read the XLA FFI header ", dir, "/", name,
                         " (compile_ffi_include_dir)"));
      }
      v1::SourceFile& f = opts->ffi_headers.emplace_back();
      f.set_name("xla/ffi/api/" + name);
      f.set_text(std::move(text));
      hashed.append(f.name().c_str(), f.name().size() + 1);
      hashed.append(f.text().c_str(), f.text().size() + 1);
    }
    opts->ffi_headers_digest = Sha256Digest(hashed);
    spdlog::info("compile service: XLA FFI headers from {} ({})", root,
                 opts->ffi_headers_digest);
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "the compile service's XLA FFI headers were not found (no "
      "xla/ffi/api/ffi.h under ",
      absl::StrJoin(tried, " or "),
      "); set compile_ffi_include_dir to a directory holding "
      "xla/ffi/api/ffi.h, e.g. the output of `python -c \"import jax.ffi; "
      "print(jax.ffi.include_dir())\"` for the jaxlib your clients use"));
}

// The cluster's other hosts (DESIGN §10, §13): before compiling a key, a
// host asks etcd whether a host built it (then fetches the module from a
// peer, verified against the recorded digest) or is building it (then
// waits for that, up to the compile's wall-clock limit and a minute);
// otherwise it claims the key and compiles.
class ClusterCompilePeers final : public CompilePeers {
 public:
  ClusterCompilePeers(ClusterRegistry* cluster, double wall_s)
      : cluster_(cluster), wait_s_(wall_s + 60) {}

  std::optional<std::string> Before(const std::string& key,
                                    int64_t* claim) override {
    const std::string hex = KeyHex(key);
    const auto deadline =
        std::chrono::steady_clock::now() +
        std::chrono::milliseconds(static_cast<int64_t>(wait_s_ * 1000));
    bool said_waiting = false;
    while (std::chrono::steady_clock::now() < deadline) {
      absl::StatusOr<std::optional<ClusterRegistry::CompiledModule>> found =
          cluster_->FindCompiled(hex);
      if (!found.ok()) return Local(key, found.status());
      if (*found) {
        absl::StatusOr<std::string> bytes =
            cluster_->FetchModule((*found)->digest, (*found)->size);
        if (!bytes.ok()) return Local(key, bytes.status());
        spdlog::info("compile {}: fetched {} from a peer, not compiled", key,
                     (*found)->digest);
        return *std::move(bytes);
      }
      absl::StatusOr<int64_t> lease =
          cluster_->ClaimCompile(hex, static_cast<int64_t>(wait_s_));
      if (!lease.ok()) return Local(key, lease.status());
      if (*lease != 0) {
        // The host that held the claim may have recorded its module and
        // let go of the claim since FindCompiled: look once more.
        found = cluster_->FindCompiled(hex);
        if (found.ok() && *found) {
          cluster_->ReleaseCompile(*lease);
          continue;
        }
        *claim = *lease;
        return std::nullopt;  // ours to compile
      }
      if (!said_waiting) {
        spdlog::info("compile {}: another host is compiling it; waiting", key);
        said_waiting = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    spdlog::warn(
        "compile {}: no other host finished it in {} s; compiling "
        "here",
        key, wait_s_);
    return std::nullopt;
  }

  void Done(const std::string& key, const std::string& digest, uint64_t size,
            int64_t claim) override {
    if (!digest.empty()) {
      absl::Status s = cluster_->RecordCompiled(
          KeyHex(key), ClusterRegistry::CompiledModule{digest, size});
      if (!s.ok()) {
        spdlog::warn(
            "compile {}: not recorded in etcd ({}); other hosts "
            "will compile it themselves",
            key, std::string(s.message()));
      }
    }
    cluster_->ReleaseCompile(claim);
  }

 private:
  std::optional<std::string> Local(const std::string& key,
                                   const absl::Status& why) {
    spdlog::warn(
        "compile {}: the cluster could not say or serve whether "
        "another host built it ({}); compiling here",
        key, std::string(why.message()));
    return std::nullopt;
  }

  ClusterRegistry* const cluster_;
  const double wait_s_;
};

}  // namespace

CompilePart::CompilePart(DaemonCore* core, const ClusterPart* cluster)
    : core_(core), config_(core->config), cluster_(cluster) {}

CompilePart::~CompilePart() = default;

absl::Status CompilePart::Start() {
  cache_ = std::make_unique<CompileCache>(config_.state_dir + "/compile",
                                          config_.compile_cache_bytes);
  KREG_RETURN_IF_ERROR(cache_->Init());
  CompileOptions opts;
  opts.worker_binary =
      HelperBinary(config_.compile_binary, "kregd-compile", "kregd_compile");
  if (::access(opts.worker_binary.c_str(), X_OK) != 0) {
    spdlog::warn(
        "the compile worker {} is missing or not executable; CompileTarget "
        "will fail until it is installed (or compile_binary is set)",
        opts.worker_binary);
  }
  opts.cxx = config_.compile_cxx;
  opts.nvcc = CompileNvcc(config_);
  KREG_RETURN_IF_ERROR(LoadFfiHeaders(config_, &opts));
  opts.limits.set_cpu_s(static_cast<uint64_t>(config_.compile_cpu_s));
  opts.limits.set_wall_s(config_.compile_timeout_s);
  opts.limits.set_memory_bytes(config_.compile_memory_bytes);
  opts.limits.set_output_bytes(config_.compile_output_bytes);
  opts.limits.set_processes(
      static_cast<uint64_t>(config_.compile_max_processes));
  opts.max_parallel =
      config_.max_parallel_compiles > 0
          ? static_cast<int>(config_.max_parallel_compiles)
          : std::max(1,
                     static_cast<int>(std::thread::hardware_concurrency()) / 2);
  opts.queue.max_running_per_uid =
      static_cast<int>(config_.compile_max_running_per_uid);
  opts.queue.max_queued = static_cast<int>(config_.compile_max_queued);
  opts.queue.max_queued_per_uid =
      static_cast<int>(config_.compile_max_queued_per_uid);
  opts.queue.max_queued_bytes = config_.compile_max_queued_bytes;
  opts.queue.max_queued_bytes_per_uid =
      config_.compile_max_queued_bytes_per_uid;
  spdlog::info(
      "compile service: up to {} compiles at once, cache {} ({} bytes), "
      "g++ {}, nvcc {}",
      opts.max_parallel, config_.state_dir + "/compile",
      config_.compile_cache_bytes, opts.cxx,
      opts.nvcc.empty() ? "not found" : opts.nvcc);
  const double wall_s = opts.limits.wall_s();
  service_ = std::make_unique<CompileService>(&core_->registrar, cache_.get(),
                                              std::move(opts));
  if (cluster_->cluster() != nullptr) {
    peers_ = std::make_unique<ClusterCompilePeers>(cluster_->cluster(), wall_s);
    service_->set_peers(peers_.get());
  }
  return absl::OkStatus();
}

void CompilePart::Quiesce() {
  if (service_ != nullptr) service_->Shutdown();
}

void CompilePart::FillStatus(v1::GetStatusResponse* r) {
  if (service_ == nullptr) return;
  CompileCounts c = service_->counts();
  r->set_compile_requests(c.requests);
  r->set_compiles(c.compiles);
  r->set_compile_cache_hits(c.cache_hits);
  r->set_compile_waits(c.waits);
  r->set_compile_failures(c.failures);
  r->set_compile_peer_fetches(c.peer_fetches);
  CompileCacheUsage u = cache_->Usage();
  r->set_compile_cache_bytes(u.bytes);
  r->set_compile_cache_entries(static_cast<uint32_t>(u.files));
}

}  // namespace kreg
