// The executor's side of a re-point (docs/replace.md section 3) with the
// real demo module: what it acks, and what it refuses with which message.
#include "daemon/executor/repoint_apply.h"

#include <fcntl.h>

#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "catch2/catch.hpp"
#include "daemon/base/sha256.h"

namespace kreg {
namespace {

constexpr char kDemo[] = "kernels/cpu/libdemo.so";

std::string DemoDigest() {
  std::ifstream in(kDemo, std::ios::binary);
  REQUIRE(in);
  return Sha256Digest(std::string(std::istreambuf_iterator<char>(in), {}));
}

std::vector<UniqueFd> Demo() {
  std::vector<UniqueFd> fds;
  fds.emplace_back(::open(kDemo, O_RDONLY | O_CLOEXEC));
  REQUIRE(fds[0].ok());
  return fds;
}

v1::ExecRepoint Request(const std::string& digest, const std::string& func) {
  v1::ExecRepoint r;
  r.set_target_name("demo.scale");
  r.set_platform("cpu");
  r.set_generation(2);
  r.set_module_digest(digest);
  r.set_func_name(func);
  r.set_token(5);
  return r;
}

TEST_CASE("A re-point loads the module, fills the table and acks",
          "[repoint]") {
  ModuleCache modules;
  RepointTable table;
  v1::ExecRepointAck ack =
      ApplyRepoint(Request(DemoDigest(), "Scale"), Demo(), &modules, &table);
  CHECK(ack.status().code() == 0);
  CHECK(ack.status().message().empty());
  CHECK(ack.target_name() == "demo.scale");
  CHECK(ack.platform() == "cpu");
  CHECK(ack.generation() == 2);
  std::optional<RepointTable::Handler> h =
      table.Find({"demo.scale", Platform::kCpu});
  REQUIRE(h.has_value());
  CHECK(h->generation == 2);
  CHECK(h->handler != nullptr);
  CHECK(h->token == 5);  // the generation's stats row
  CHECK(table.epoch() == 1);
}

TEST_CASE("A re-point the executor cannot apply is answered with why",
          "[repoint]") {
  ModuleCache modules;
  RepointTable table;
  const std::string digest = DemoDigest();
  struct Case {
    v1::ExecRepoint request;
    int fds;
    int code;
    std::string message;
  };
  v1::ExecRepoint bad_platform = Request(digest, "Scale");
  bad_platform.set_platform("tpu");
  v1::ExecRepoint no_name = Request(digest, "Scale");
  no_name.set_target_name("");
  const std::vector<Case> cases = {
      {Request("sha256:" + std::string(64, '0'), "Scale"), 1,
       static_cast<int>(absl::StatusCode::kDataLoss),
       "the attached module's digest is " + digest +
           ", not sha256:" + std::string(64, '0')},
      {Request(digest, "NoSuchSymbol"), 1,
       static_cast<int>(absl::StatusCode::kNotFound),
       "symbol \"NoSuchSymbol\" is not in module " + digest},
      {Request(digest, "Scale"), 0,
       static_cast<int>(absl::StatusCode::kInvalidArgument),
       "0 descriptors attached; expected the module's one"},
      {bad_platform, 1, static_cast<int>(absl::StatusCode::kUnimplemented),
       "tpu"},
      {no_name, 1, static_cast<int>(absl::StatusCode::kInvalidArgument), ""},
  };
  for (const Case& c : cases) {
    INFO(c.message);
    std::vector<UniqueFd> fds;
    if (c.fds == 1) fds = Demo();
    v1::ExecRepointAck ack =
        ApplyRepoint(c.request, std::move(fds), &modules, &table);
    CHECK(ack.status().code() == c.code);
    CHECK(ack.status().message().find(c.message) != std::string::npos);
    if (!c.request.target_name().empty()) {
      CHECK(ack.status().message().rfind(
                "the executor cannot switch target \"demo.scale\" (" +
                    c.request.platform() + ") to generation 2: ",
                0) == 0);
    }
    CHECK(ack.generation() == 2);
  }
  // Nothing was switched.
  CHECK(table.epoch() == 0);
}

}  // namespace
}  // namespace kreg
