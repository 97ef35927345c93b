#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "client/kregctl/common.h"
#include "common/status_macros.h"

namespace kreg {
namespace {

namespace fs = std::filesystem;

struct CompileArgs {
  std::string target_name;
  std::string func_name;
  std::vector<std::string> sources;       // paths; sent by their base name
  std::vector<std::string> headers;       // paths; sent by their base name
  std::vector<std::string> include_dirs;  // sent as their files
  std::vector<std::string> options;
  std::string platform = "cpu";
  std::string content_id;
  double timeout_s = 900;
  bool as_json = false;
};

// The file's bytes; PERMISSION_DENIED / NOT_FOUND naming it otherwise.
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::error_code ec;
    bool exists = fs::exists(path, ec);
    std::string why = std::strerror(errno);
    return exists ? absl::PermissionDeniedError(
                        absl::StrCat("cannot read \"", path, "\": ", why))
                  : absl::NotFoundError(
                        absl::StrCat("no such file \"", path, "\""));
  }
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

absl::Status AddFile(const std::string& path, const std::string& name,
                     google::protobuf::RepeatedPtrField<v1::SourceFile>* out) {
  KREG_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  v1::SourceFile* f = out->Add();
  f->set_name(name);
  f->set_text(std::move(text));
  return absl::OkStatus();
}

// Reads the files (as this process: what the caller cannot read is not
// sent), compiles, prints the registration (or JSON). Returns the exit code.
int RunCompile(Client& client, const CompileArgs& a) {
  const auto fail = [](const absl::Status& s) { return Fail(s); };
  v1::CompileTargetRequest req;
  req.set_target_name(a.target_name);
  req.set_func_name(a.func_name);
  req.set_platform(a.platform);
  req.set_content_id(a.content_id);
  for (const std::string& o : a.options) req.add_options(o);
  for (const std::string& s : a.sources) {
    absl::Status st =
        AddFile(s, fs::path(s).filename().string(), req.mutable_sources());
    if (!st.ok()) return fail(st);
  }
  for (const std::string& h : a.headers) {
    absl::Status st =
        AddFile(h, fs::path(h).filename().string(), req.mutable_headers());
    if (!st.ok()) return fail(st);
  }
  for (const std::string& dir : a.include_dirs) {
    std::error_code ec;
    fs::recursive_directory_iterator it(dir, ec), end;
    if (ec) {
      return fail(absl::PermissionDeniedError(absl::StrCat(
          "cannot read include directory \"", dir, "\": ", ec.message())));
    }
    for (; it != end; it.increment(ec)) {
      if (ec) break;
      if (!it->is_regular_file()) continue;
      std::string rel = fs::relative(it->path(), dir).generic_string();
      absl::Status st =
          AddFile(it->path().string(), rel, req.mutable_headers());
      if (!st.ok()) return fail(st);
    }
    if (ec) {
      return fail(absl::PermissionDeniedError(absl::StrCat(
          "cannot read include directory \"", dir, "\": ", ec.message())));
    }
  }
  std::string diagnostics;
  absl::StatusOr<v1::CompileTargetResult> r = client.Compile(
      req, a.timeout_s, [&](const std::string& d) { diagnostics += d; });
  // The compiler's output verbatim, once: a failure's message carries it
  // whole unless it is long.
  if (!r.ok()) {
    if (r.status().message().find(diagnostics) == absl::string_view::npos) {
      std::cerr << diagnostics;
    }
    return fail(r.status());
  }
  std::cerr << diagnostics;
  if (a.as_json) {
    nlohmann::ordered_json j{{"created", r->created()},
                             {"cache_key", r->cache_key()},
                             {"cache_hit", r->cache_hit()},
                             {"waited", r->waited()},
                             {"target", TargetJson(r->target())}};
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << (r->created() ? "registered " : "already registered ")
              << r->target().target_name() << " (" << r->target().platform()
              << "): " << r->target().func_name() << ", content_id "
              << r->target().content_id() << " ("
              << (r->cache_hit() ? "cache hit, no compile"
                  : r->waited()  ? "compiled once for concurrent requests"
                                 : "compiled")
              << ")\n";
  }
  return 0;
}

}  // namespace

Command AddCompileCommand(CLI::App& app) {
  auto a = std::make_shared<CompileArgs>();
  CLI::App* c = app.add_subcommand(
      "compile",
      "kregd compiles SOURCE... once (in a sandbox, as you) and registers "
      "FUNC of the result as NAME");
  c->add_option("NAME", a->target_name, "target name")->required();
  c->add_option("FUNC", a->func_name, "the handler symbol")->required();
  c->add_option("SOURCE", a->sources, "source files (sent by base name)")
      ->required();
  c->add_option("--platform", a->platform, "cpu (default) or cuda");
  c->add_option("--header", a->headers,
                "a header file, sent by base name (repeatable)");
  c->add_option("--include-dir", a->include_dirs,
                "a directory whose files are sent as headers by their path "
                "inside it (repeatable)");
  c->add_option("--option", a->options,
                "a compiler option, e.g. --option=-DN=4 (repeatable)");
  c->add_option("--content-id", a->content_id,
                "register under this content_id instead of the cache key");
  c->add_option("--timeout", a->timeout_s, "seconds to wait (default 900)");
  c->add_flag("--json", a->as_json, "print JSON");
  return {c, [a](Connection& kregd) { return RunCompile(*kregd.client, *a); }};
}

}  // namespace kreg
