// kregctl register: uploads a module (or names a path kregd reads itself)
// and binds a target to one of its handlers.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "client/kregctl/common.h"

namespace kreg {
namespace {

// Modules at least this large show upload progress on a terminal.
constexpr uint64_t kProgressBytes = 8ull << 20;

// Upload progress on stderr, only when it is a terminal.
void ShowProgress(uint64_t sent, uint64_t total) {
  std::fprintf(stderr, "\ruploading %.1f / %.1f MiB (%3d%%)",
               static_cast<double>(sent) / (1 << 20),
               static_cast<double>(total) / (1 << 20),
               static_cast<int>(total == 0 ? 100 : sent * 100 / total));
  if (sent >= total) std::fprintf(stderr, "\n");
}

struct RegisterOptions {
  RegisterRequest req;
  // --function values: SYMBOL (the execute function) or STAGE=SYMBOL.
  std::vector<std::string> functions;
  std::string state_type;  // --state-type NAME/TYPE_ID_SYMBOL/TYPE_INFO_SYMBOL
  std::string module_file;
  bool daemon_reads = false;
};

// Reads the module into `req` for upload. Returns 0, or the exit code after
// printing why not.
int ReadModule(Connection& kregd, const std::string& module_file,
               RegisterRequest* req) {
  struct stat st {};
  errno = 0;
  if (::stat(module_file.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    std::cerr << "cannot read module file \"" << module_file << "\": "
              << (errno != 0            ? std::strerror(errno)
                  : S_ISDIR(st.st_mode) ? "it is a directory"
                                        : "it is not a regular file")
              << "\n";
    return 2;
  }
  // The one upload limit is kregd's max_module_bytes: refuse before
  // reading or sending anything (a kregd that does not report it checks
  // on receipt).
  auto daemon = kregd.client->Status();
  if (!daemon.ok()) return Fail(daemon.status());
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (daemon->max_module_bytes() != 0 && size > daemon->max_module_bytes()) {
    std::cerr << "module \"" << module_file << "\" has " << size
              << " bytes, more than kregd's max_module_bytes ("
              << daemon->max_module_bytes()
              << "); nothing was sent. Raise max_module_bytes in kregd's "
                 "config (or --max-module-bytes)\n";
    return 2;
  }
  std::ifstream in(module_file, std::ios::binary);
  if (!in) {
    std::cerr << "cannot read module file \"" << module_file
              << "\": " << std::strerror(errno) << "\n";
    return 2;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  req->module_bytes = ss.str();
  req->module_file_name = module_file.substr(module_file.rfind('/') + 1);
  if (req->module_bytes.size() >= kProgressBytes && ::isatty(2)) {
    req->progress = ShowProgress;
  }
  return 0;
}

// Fills `req`'s function or bundle from --function and --state-type.
// Returns 0, or 2 after printing why not (kregd checks stage names and
// symbols; this only splits the spelling).
int ParseFunctions(const RegisterOptions& opts, RegisterRequest* req) {
  const bool bundle = !opts.state_type.empty() || opts.functions.size() > 1 ||
                      opts.functions[0].find('=') != std::string::npos;
  if (!bundle) {
    req->func_name = opts.functions[0];
    return 0;
  }
  for (const std::string& f : opts.functions) {
    const size_t eq = f.find('=');
    if (eq == std::string::npos) {
      req->stages.emplace_back("execute", f);
    } else {
      req->stages.emplace_back(f.substr(0, eq), f.substr(eq + 1));
    }
  }
  if (!opts.state_type.empty()) {
    const size_t a = opts.state_type.find('/');
    const size_t b =
        a == std::string::npos ? a : opts.state_type.find('/', a + 1);
    if (b == std::string::npos) {
      std::cerr << "--state-type \"" << opts.state_type
                << "\" is not NAME/TYPE_ID_SYMBOL/TYPE_INFO_SYMBOL (the name "
                   "the type is registered under, then the module's data "
                   "symbols of its XLA_FFI_TypeId and XLA_FFI_TypeInfo)\n";
      return 2;
    }
    req->state_type_name = opts.state_type.substr(0, a);
    req->state_type_id_symbol = opts.state_type.substr(a + 1, b - a - 1);
    req->state_type_info_symbol = opts.state_type.substr(b + 1);
  }
  return 0;
}

int RunRegister(Connection& kregd, const RegisterOptions& opts) {
  RegisterRequest req = opts.req;
  if (int rc = ParseFunctions(opts, &req); rc != 0) return rc;
  if (opts.daemon_reads) {
    req.daemon_path = opts.module_file;
  } else if (int rc = ReadModule(kregd, opts.module_file, &req); rc != 0) {
    return rc;
  }
  auto resp = kregd.client->Register(req);
  if (!resp.ok()) return Fail(resp.status());
  const auto& t = resp->target();
  // A replacement makes a new generation of an existing target
  // (docs/replace.md); generation 1 is the first registration.
  const bool replaced = resp->created() && t.generation() > 1;
  std::cout << (replaced          ? "replaced "
                : resp->created() ? "registered "
                                  : "already registered ")
            << t.target_name() << " (" << t.platform() << ") "
            << t.content_id();
  if (replaced) std::cout << ": generation " << t.generation();
  std::cout << "\n";
  return 0;
}

}  // namespace

Command AddRegisterCommand(CLI::App& app) {
  auto opts = std::make_shared<RegisterOptions>();
  RegisterRequest& req = opts->req;
  CLI::App* cmd = app.add_subcommand("register", "register a target");
  cmd->add_option("NAME", req.target_name, "target name")->required();
  cmd->add_option("--module", opts->module_file, "kernel .so")->required();
  cmd->add_option("--function", opts->functions,
                  "handler symbol (the execute stage), or STAGE=SYMBOL once "
                  "per stage of a handler bundle (instantiate, prepare, "
                  "initialize, execute)")
      ->required();
  cmd->add_option("--state-type", opts->state_type,
                  "a bundle's state type: NAME/TYPE_ID_SYMBOL/TYPE_INFO_SYMBOL "
                  "(the module's data symbols of its XLA_FFI_TypeId and "
                  "XLA_FFI_TypeInfo)");
  cmd->add_option("--platform", req.platform, "cpu or cuda")
      ->capture_default_str();
  cmd->add_option("--content-id", req.content_id, "content identity");
  cmd->add_flag("--replace", req.replace,
                "replace the target's content in place, making its next "
                "generation (kregd with replace = \"owner\", by the "
                "target's owner or root; otherwise a change is refused "
                "either way; see docs/replace.md)");
  cmd->add_flag("--daemon-reads", opts->daemon_reads,
                "send the path for the daemon to read (under its allowed "
                "roots) instead of uploading the bytes");
  return {cmd, [opts](Connection& kregd) { return RunRegister(kregd, *opts); }};
}

}  // namespace kreg
