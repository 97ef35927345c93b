// The compile service's part of the kregd process (DESIGN §13).
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "daemon/compile/compile_cache.h"
#include "daemon/compile/compile_service.h"
#include "daemon/server.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

std::string ExeDir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

}  // namespace

absl::Status Daemon::StartCompile() {
  compile_cache_ = std::make_unique<CompileCache>(
      config_.state_dir + "/compile", config_.compile_cache_bytes);
  if (absl::Status s = compile_cache_->Init(); !s.ok()) return s;
  CompileOptions opts;
  opts.worker_binary = config_.compile_binary;
  if (opts.worker_binary.empty()) {
    // Installed: next to kregd; in a Bazel tree: bazel-bin/daemon/compile/.
    opts.worker_binary = ExeDir() + "/kregd-compile";
    if (::access(opts.worker_binary.c_str(), X_OK) != 0) {
      opts.worker_binary = ExeDir() + "/compile/kregd-compile";
    }
  }
  if (::access(opts.worker_binary.c_str(), X_OK) != 0) {
    spdlog::warn(
        "the compile worker {} is missing or not executable; CompileTarget "
        "will fail until it is installed (or compile_binary is set)",
        opts.worker_binary);
  }
  opts.cxx = config_.compile_cxx;
  opts.nvcc = CompileNvcc(config_);
  opts.ffi_include_dir = CompileFfiIncludeDir(config_);
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
  spdlog::info(
      "compile service: up to {} compiles at once, cache {} ({} bytes), "
      "g++ {}, nvcc {}",
      opts.max_parallel, config_.state_dir + "/compile",
      config_.compile_cache_bytes, opts.cxx,
      opts.nvcc.empty() ? "not found" : opts.nvcc);
  compile_ = std::make_unique<CompileService>(&registrar_, compile_cache_.get(),
                                              std::move(opts));
  return absl::OkStatus();
}

void Daemon::FillCompileStatus(v1::GetStatusResponse* r) {
  if (compile_ == nullptr) return;
  CompileCounts c = compile_->counts();
  r->set_compile_requests(c.requests);
  r->set_compiles(c.compiles);
  r->set_compile_cache_hits(c.cache_hits);
  r->set_compile_waits(c.waits);
  r->set_compile_failures(c.failures);
  CompileCacheUsage u = compile_cache_->Usage();
  r->set_compile_cache_bytes(u.bytes);
  r->set_compile_cache_entries(static_cast<uint32_t>(u.files));
}

}  // namespace kreg
