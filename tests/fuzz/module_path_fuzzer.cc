// Fuzzes the daemon-side module path resolver (module_path.cc): fuzzed paths
// relative to a temp root full of traps (symlinks in and out, absolute and
// relative, a loop, a FIFO, a directory link, a second root inside the
// first) are opened with OpenModulePath. A descriptor may only come back for
// a regular file whose real path lies under the root it names; the helper's
// reply encoding must round-trip, and its decoder must survive raw bytes.
//
// Input: byte 0 picks the allowed roots; the rest is the path (cut at a NUL,
// as a C string would be), appended to "<root>/".
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "daemon/base/module_path.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

struct Fixture {
  std::string base, root, inner, outside;
};

const Fixture& Dirs() {
  static const Fixture* f = [] {
    auto* x = new Fixture;
    x->base = kreg::fuzz::MakeTempDir("path-fuzz");
    x->root = x->base + "/root";
    x->inner = x->root + "/dir";
    x->outside = x->base + "/outside";
    for (const std::string& d :
         {x->root, x->inner, x->inner + "/sub", x->outside}) {
      ::mkdir(d.c_str(), 0755);
    }
    for (const std::string& f :
         {x->root + "/a.so", x->inner + "/b.so", x->outside + "/secret.so"}) {
      std::ofstream(f) << "module";
    }
    ::mkfifo((x->root + "/fifo").c_str(), 0644);
    const std::pair<std::string, std::string> links[] = {
        {"a.so", "/link_in"},
        {x->root + "/a.so", "/link_abs_in"},
        {"../outside/secret.so", "/link_out"},
        {"/etc/passwd", "/link_abs_out"},
        {"../../outside", "/dir/up"},
        {"loop2", "/loop1"},
        {"loop1", "/loop2"},
        {"dir", "/dirlink"},
        {"fifo", "/fifolink"},
        {"/proc/self/fd/0", "/magic"},
        {"missing", "/dangling"},
    };
    for (const auto& [target, name] : links) {
      ::symlink(target.c_str(), (x->root + name).c_str());
    }
    return x;
  }();
  return *f;
}

void Check(const kreg::PathOpen& r) {
  using kreg::PathOpen;
  using kreg::fuzz::Fail;
  if (r.fd.ok() != (r.stage == PathOpen::kOpened)) {
    Fail("a descriptor at stage " + std::to_string(r.stage));
  }
  if (r.stage >= PathOpen::kOpenFailed) {
    if (r.root.empty() ||
        !(r.real == r.root || absl::StartsWith(r.real, r.root + "/"))) {
      Fail("\"" + r.real + "\" is not under root \"" + r.root + "\"");
    }
  }
  if (r.stage == PathOpen::kOpened) {
    struct stat st;
    if (::fstat(r.fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
      Fail("opened something that is not a regular file: " + r.real);
    }
    char buf[PATH_MAX];
    std::string self = "/proc/self/fd/" + std::to_string(r.fd.get());
    ssize_t n = ::readlink(self.c_str(), buf, sizeof(buf));
    std::string opened(buf, n > 0 ? static_cast<size_t>(n) : 0);
    if (!absl::StartsWith(opened, r.root + "/")) {
      Fail("opened \"" + opened + "\" outside root \"" + r.root + "\"");
    }
  }
  absl::StatusOr<PathOpen> back = kreg::DecodePathOpen(kreg::EncodePathOpen(r));
  if (!back.ok() || back->stage != r.stage || back->err != r.err ||
      back->mode != r.mode || back->root != r.root || back->real != r.real) {
    Fail("EncodePathOpen/DecodePathOpen do not round-trip: " + r.real);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  Dirs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Fixture& d = Dirs();
  std::vector<std::string> roots;
  switch (data[0] % 3) {
    case 0:
      roots = {d.root};
      break;
    case 1:
      roots = {d.inner};
      break;
    default:
      roots = {d.inner, d.root};
  }
  std::string raw(reinterpret_cast<const char*>(data) + 1, size - 1);
  kreg::DecodePathOpen(raw).ok();  // the helper's reply, unchecked bytes
  std::string rel = raw.substr(0, raw.find('\0'));
  Check(kreg::OpenModulePath(d.root + "/" + rel, roots));
  return 0;
}
