#include "daemon/compile_service/compile_request.h"

#include <string>

#include "catch2/catch.hpp"

namespace kreg {
namespace {

v1::CompileTargetRequest Request() {
  v1::CompileTargetRequest r;
  r.set_target_name("cc.x");
  r.set_func_name("Handler");
  r.set_platform("cpu");
  v1::SourceFile* f = r.add_sources();
  f->set_name("k.cc");
  f->set_text("int x;");
  return r;
}

std::string Refusal(const v1::CompileTargetRequest& r) {
  absl::StatusOr<CompileRequest> p = ParseCompileRequest(r);
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().code() != absl::StatusCode::kOk);
  return std::string(p.status().message());
}

TEST_CASE("A plain request is accepted, files sorted", "[compile]") {
  v1::CompileTargetRequest r = Request();
  v1::SourceFile* a = r.add_sources();
  a->set_name("a.cpp");
  v1::SourceFile* h = r.add_headers();
  h->set_name("detail/x.h");
  r.add_options("-DN=4");
  r.set_platform("HOST");
  absl::StatusOr<CompileRequest> p = ParseCompileRequest(r);
  REQUIRE(p.ok());
  CHECK(p->platform == Platform::kCpu);
  REQUIRE(p->sources.size() == 2);
  CHECK(p->sources[0].first == "a.cpp");
  CHECK(p->headers[0].first == "detail/x.h");
  CHECK(p->options == std::vector<std::string>{"-DN=4"});
}

TEST_CASE("Bad source names are refused, quoting the name", "[compile]") {
  for (const char* name : {"../k.cc", "a/k.cc", "/k.cc", ".", "..", "-k.cc",
                           "k .cc", "k\\x.cc", ""}) {
    v1::CompileTargetRequest r = Request();
    r.mutable_sources(0)->set_name(name);
    std::string msg = Refusal(r);
    CHECK(msg.find("source name") != std::string::npos);
  }
}

TEST_CASE("Sources need a source extension; .cu only for cuda", "[compile]") {
  v1::CompileTargetRequest r = Request();
  r.mutable_sources(0)->set_name("k.h");
  CHECK(Refusal(r).find("needs a C or C++ source extension") !=
        std::string::npos);
  r.mutable_sources(0)->set_name("k.cu");
  CHECK(Refusal(r).find("needs a C or C++ source extension") !=
        std::string::npos);
  r.set_platform("cuda");
  CHECK(ParseCompileRequest(r).ok());
}

TEST_CASE("Bad header paths are refused", "[compile]") {
  for (const char* name : {"../h.h", "/etc/h.h", "a//h.h", "a/./h.h",
                           "a/../h.h", "a/-h.h", "a/"}) {
    v1::CompileTargetRequest r = Request();
    r.add_headers()->set_name(name);
    std::string msg = Refusal(r);
    CHECK(msg.find("header name") != std::string::npos);
  }
}

TEST_CASE("A name sent twice is refused", "[compile]") {
  v1::CompileTargetRequest r = Request();
  r.add_headers()->set_name("k.cc");
  CHECK(Refusal(r).find("is sent twice") != std::string::npos);
}

TEST_CASE("A file cannot also be a directory", "[compile]") {
  v1::CompileTargetRequest r = Request();
  r.add_headers()->set_name("a.h");
  r.add_headers()->set_name("a.h/b.h");
  CHECK(Refusal(r).find("lies under \"a.h\", which is sent as a file") !=
        std::string::npos);
}

TEST_CASE("Counts and sizes are bounded", "[compile]") {
  v1::CompileTargetRequest none = Request();
  none.clear_sources();
  CHECK(Refusal(none).find("no sources") != std::string::npos);

  v1::CompileTargetRequest many = Request();
  for (size_t i = 0; i < kMaxCompileFiles; ++i) {
    many.add_headers()->set_name("h" + std::to_string(i) + ".h");
  }
  CHECK(Refusal(many).find("257 files") != std::string::npos);

  v1::CompileTargetRequest big = Request();
  big.mutable_sources(0)->set_text(std::string(kMaxCompileInputBytes, 'x'));
  CHECK(Refusal(big).find("exceed the limit of 7340032 bytes") !=
        std::string::npos);

  v1::CompileTargetRequest opts = Request();
  for (size_t i = 0; i <= kMaxCompileOptions; ++i) opts.add_options("-O2");
  CHECK(Refusal(opts).find("65 options") != std::string::npos);

  v1::CompileTargetRequest nul = Request();
  nul.add_options(std::string("-D\0x", 4));
  CHECK(Refusal(nul).find("without NUL") != std::string::npos);

  v1::CompileTargetRequest longname = Request();
  longname.mutable_sources(0)->set_name(std::string(300, 'k') + ".cc");
  CHECK(Refusal(longname).find("longer than 255 bytes") != std::string::npos);
}

TEST_CASE("Target, function and platform are validated", "[compile]") {
  v1::CompileTargetRequest r = Request();
  r.set_target_name("9x");
  CHECK(Refusal(r).find("9x") != std::string::npos);
  r = Request();
  r.set_func_name("no-sym");
  CHECK(Refusal(r).find("no-sym") != std::string::npos);
  r = Request();
  r.set_platform("rocm");
  CHECK(ParseCompileRequest(r).status().code() ==
        absl::StatusCode::kUnimplemented);
  r = Request();
  r.set_content_id("has space");
  CHECK(Refusal(r).find("content_id") != std::string::npos);
}

TEST_CASE(
    "The cache key covers sources, headers, options, platform and "
    "compiler",
    "[compile]") {
  auto key = [](const v1::CompileTargetRequest& r, const char* id) {
    absl::StatusOr<CompileRequest> p = ParseCompileRequest(r);
    REQUIRE(p.ok());
    return CompileCacheKey(*p, id);
  };
  v1::CompileTargetRequest base = Request();
  base.add_headers()->set_name("h.h");
  const std::string k = key(base, "g++ 12");
  CHECK(k.rfind("kcc-sha256:", 0) == 0);
  CHECK(k.size() == 11 + 64);
  CHECK(KeyHex(k) == k.substr(11));
  // Not part of the key: the target and function names.
  v1::CompileTargetRequest renamed = base;
  renamed.set_target_name("cc.other");
  renamed.set_func_name("Other");
  CHECK(key(renamed, "g++ 12") == k);
  // File order does not matter; names, bytes and options do.
  v1::CompileTargetRequest two = base;
  two.add_sources()->set_name("a.cc");
  v1::CompileTargetRequest two_swapped = base;
  *two_swapped.mutable_sources(0) = two.sources(1);
  *two_swapped.add_sources() = two.sources(0);
  CHECK(key(two, "g++ 12") == key(two_swapped, "g++ 12"));
  CHECK(key(two, "g++ 12") != k);
  v1::CompileTargetRequest text = base;
  text.mutable_sources(0)->set_text("int y;");
  CHECK(key(text, "g++ 12") != k);
  v1::CompileTargetRequest header = base;
  header.mutable_headers(0)->set_text("//");
  CHECK(key(header, "g++ 12") != k);
  v1::CompileTargetRequest option = base;
  option.add_options("-O3");
  CHECK(key(option, "g++ 12") != k);
  v1::CompileTargetRequest cuda = base;
  cuda.set_platform("cuda");
  CHECK(key(cuda, "g++ 12") != k);
  CHECK(key(base, "g++ 13") != k);
  // A header's bytes cannot pass for a source's: fields are tagged and
  // length-prefixed.
  v1::CompileTargetRequest moved = base;
  moved.mutable_sources(0)->set_text("int x;h.h");
  moved.mutable_headers(0)->set_name("h");
  CHECK(key(moved, "g++ 12") != k);
}

TEST_CASE("A build is kept per caller uid under the same key",
          "[compile]") {
  const std::string k = "kcc-sha256:" + std::string(64, 'a');
  const std::string mine = CallerScopedKey(k, 1000);
  CHECK(mine.rfind("kcc-sha256:", 0) == 0);
  CHECK(mine.size() == 11 + 64);
  CHECK(mine != k);
  CHECK(CallerScopedKey(k, 1000) == mine);
  CHECK(CallerScopedKey(k, 1001) != mine);
  CHECK(CallerScopedKey("kcc-sha256:" + std::string(64, 'b'), 1000) != mine);
}

}  // namespace
}  // namespace kreg
