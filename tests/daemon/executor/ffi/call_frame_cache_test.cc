// FfiHost with a CallFrameCache (CallOptions::frame_cache): attribute tables
// are kept per attrs_generation and reused, several generations alternating;
// generation 0 is built every call; what a handler scribbles over its call
// frame never reaches the next call.
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/executor/ffi/ffi_host.h"
#include "tests/daemon/executor/ffi/launch_builders.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace {

using testing::AsHandler;
using testing::Buffer;
using testing::Dict;
using testing::Scalar;
using testing::String;

// What the last Observe call saw.
struct Seen {
  const void* types = nullptr;  // the attribute table's address
  int64_t num_attrs = -1;
  int64_t num_args = -1;
  int64_t num_rets = -1;
  float factor = 0;
  std::string text;
  float in0 = 0;
  int stage = -1;
  bool future_null = false;
};
Seen g_seen;

// Records its frame; reads attribute 0 as an F32 scalar and attribute 1 (if
// any) as a string; writes 2 * arg 0 to ret 0.
XLA_FFI_Error* Observe(XLA_FFI_CallFrame* f) {
  g_seen = Seen();
  g_seen.types = f->attrs.types;
  g_seen.num_attrs = f->attrs.size;
  g_seen.num_args = f->args.size;
  g_seen.num_rets = f->rets.size;
  g_seen.stage = f->stage;
  g_seen.future_null = f->future == nullptr;
  if (f->attrs.size > 0 && f->attrs.types[0] == XLA_FFI_AttrType_SCALAR) {
    auto* s = static_cast<XLA_FFI_Scalar*>(f->attrs.attrs[0]);
    std::memcpy(&g_seen.factor, s->value, sizeof(float));
  }
  if (f->attrs.size > 1 && f->attrs.types[1] == XLA_FFI_AttrType_STRING) {
    auto* s = static_cast<XLA_FFI_ByteSpan*>(f->attrs.attrs[1]);
    g_seen.text.assign(s->ptr, s->len);
  }
  if (f->args.size > 0 && f->rets.size > 0) {
    auto* in = static_cast<XLA_FFI_Buffer*>(f->args.args[0]);
    auto* out = static_cast<XLA_FFI_Buffer*>(f->rets.rets[0]);
    g_seen.in0 = static_cast<float*>(in->data)[0];
    static_cast<float*>(out->data)[0] = 2 * g_seen.in0;
  }
  return nullptr;
}

// Writes over the fields of its frame and of the buffers it was given (but
// not `future`, which FfiHost reads after the call).
XLA_FFI_Error* Scribble(XLA_FFI_CallFrame* f) {
  auto* in = static_cast<XLA_FFI_Buffer*>(f->args.args[0]);
  in->rank = 0;
  in->dtype = XLA_FFI_DataType_TOKEN;
  f->args.size = 99;
  f->args.args = nullptr;
  f->rets.size = 77;
  f->attrs.size = 55;
  f->stage = static_cast<XLA_FFI_ExecutionStage>(9);
  return nullptr;
}

LaunchFrame Frame(std::vector<float>& x, std::vector<float>& y, float factor,
                  uint64_t generation, std::string text = "t") {
  LaunchFrame frame;
  frame.args.push_back(Buffer(XLA_FFI_DataType_F32, x));
  frame.rets.push_back(Buffer(XLA_FFI_DataType_F32, y));
  frame.attrs.emplace_back("factor", Scalar(XLA_FFI_DataType_F32, factor));
  frame.attrs.emplace_back("text", String(std::move(text)));
  frame.attrs_generation = generation;
  return frame;
}

TEST_CASE("CallFrameCache keeps attribute tables per generation",
          "[call_frame][cache]") {
  FfiHost host(FfiHostOptions{1});
  CallFrameCache cache;
  CallOptions options;
  options.frame_cache = &cache;
  std::vector<float> x = {3}, y = {0};
  LaunchFrame a = Frame(x, y, 1.5f, 1001, "a");
  LaunchFrame b = Frame(x, y, -2.0f, 1002, "bb");

  REQUIRE(host.Execute(AsHandler(Observe), a, options).ok());
  const void* a_tables = g_seen.types;
  CHECK(g_seen.factor == 1.5f);
  REQUIRE(host.Execute(AsHandler(Observe), b, options).ok());
  const void* b_tables = g_seen.types;
  CHECK(b_tables != a_tables);
  CHECK(g_seen.factor == -2.0f);
  CHECK(g_seen.text == "bb");
  // Alternating call sites: each generation's tables are reused as built.
  for (int i = 0; i < 5; ++i) {
    x[0] = static_cast<float>(i);
    REQUIRE(host.Execute(AsHandler(Observe), a, options).ok());
    CHECK(g_seen.types == a_tables);
    CHECK(g_seen.factor == 1.5f);
    CHECK(g_seen.text == "a");
    CHECK(y[0] == 2.0f * i);  // buffers are refilled every call
    REQUIRE(host.Execute(AsHandler(Observe), b, options).ok());
    CHECK(g_seen.types == b_tables);
    CHECK(g_seen.factor == -2.0f);
  }
}

TEST_CASE("CallFrameCache builds generation 0 every call",
          "[call_frame][cache]") {
  FfiHost host(FfiHostOptions{1});
  CallFrameCache cache;
  CallOptions options;
  options.frame_cache = &cache;
  std::vector<float> x = {1}, y = {0};
  LaunchFrame frame = Frame(x, y, 1.0f, 0);
  for (int i = 0; i < 4; ++i) {
    // The same LaunchFrame, its attributes changed in place.
    frame.attrs[0].second = Scalar(XLA_FFI_DataType_F32, float(i));
    frame.attrs[1].second = String(std::string(i + 1, 'z'));
    REQUIRE(host.Execute(AsHandler(Observe), frame, options).ok());
    CHECK(g_seen.factor == float(i));
    CHECK(g_seen.text == std::string(i + 1, 'z'));
  }
  // Without a cache, as before.
  REQUIRE(host.Execute(AsHandler(Observe), frame).ok());
  CHECK(g_seen.factor == 3.0f);
}

TEST_CASE("CallFrameCache survives more generations than it keeps",
          "[call_frame][cache]") {
  FfiHost host(FfiHostOptions{1});
  CallFrameCache cache;
  CallOptions options;
  options.frame_cache = &cache;
  std::vector<float> x = {1}, y = {0};
  std::vector<LaunchFrame> frames;
  for (int i = 0; i < 40; ++i) {
    frames.push_back(Frame(x, y, float(i), 5000 + i, std::to_string(i)));
  }
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 40; i += (round == 1 ? 3 : 1)) {
      REQUIRE(host.Execute(AsHandler(Observe), frames[i], options).ok());
      CHECK(g_seen.factor == float(i));
      CHECK(g_seen.text == std::to_string(i));
    }
  }
}

TEST_CASE("CallFrameCache: a handler's writes to its frame stay there",
          "[call_frame][cache]") {
  FfiHost host(FfiHostOptions{1});
  CallFrameCache cache;
  CallOptions options;
  options.frame_cache = &cache;
  std::vector<float> x = {4}, y = {0};
  LaunchFrame frame = Frame(x, y, 0.5f, 2001);
  REQUIRE(host.Execute(AsHandler(Scribble), frame, options).ok());
  REQUIRE(host.Execute(AsHandler(Observe), frame, options).ok());
  CHECK(g_seen.num_args == 1);
  CHECK(g_seen.num_rets == 1);
  CHECK(g_seen.num_attrs == 2);
  CHECK(g_seen.stage == XLA_FFI_ExecutionStage_EXECUTE);
  CHECK(g_seen.future_null);
  CHECK(g_seen.factor == 0.5f);
  CHECK(y[0] == 8.0f);
}

// ---- accounting in max_buffered_bytes (wire::ByteBudget) -----------------

TEST_CASE("CallFrameCache charges its attribute tables to the budget",
          "[call_frame][cache][budget]") {
  FfiHost host(FfiHostOptions{1});
  wire::ByteBudget budget(1 << 20);
  std::vector<float> x = {3}, y = {0};
  LaunchFrame a = Frame(x, y, 1.5f, 2001, "a");
  LaunchFrame b = Frame(x, y, 2.5f, 2002, "b");
  {
    CallFrameCache cache(&budget);
    CallOptions options;
    options.frame_cache = &cache;
    CHECK(cache.charged_bytes() == 0);
    REQUIRE(host.Execute(AsHandler(Observe), a, options).ok());
    const uint64_t one = budget.used();
    CHECK(one > 0);
    CHECK(cache.charged_bytes() == one);
    // Reusing a generation charges nothing more; a second one adds its own.
    REQUIRE(host.Execute(AsHandler(Observe), a, options).ok());
    CHECK(budget.used() == one);
    REQUIRE(host.Execute(AsHandler(Observe), b, options).ok());
    CHECK(budget.used() == 2 * one);
    CHECK(cache.charged_bytes() == 2 * one);
    // Many more generations than it keeps: evicted tables give theirs back.
    for (uint64_t g = 0; g < 40; ++g) {
      LaunchFrame f = Frame(x, y, 1.0f, 3000 + g, "c");
      REQUIRE(host.Execute(AsHandler(Observe), f, options).ok());
    }
    CHECK(budget.used() == cache.charged_bytes());
    CHECK(budget.used() <= 16 * one);
  }
  // The session ended: everything is given back.
  CHECK(budget.used() == 0);
}

TEST_CASE("CallFrameCache evicts its own tables before it refuses",
          "[call_frame][cache][budget]") {
  FfiHost host(FfiHostOptions{1});
  std::vector<float> x = {3}, y = {0};
  uint64_t one = 0;
  {
    wire::ByteBudget probe(1 << 20);
    CallFrameCache cache(&probe);
    CallOptions options;
    options.frame_cache = &cache;
    REQUIRE(host.Execute(AsHandler(Observe), Frame(x, y, 1, 4001, "a"), options)
                .ok());
    one = probe.used();
  }
  wire::ByteBudget budget(2 * one + one / 2);  // room for two sets
  CallFrameCache cache(&budget);
  CallOptions options;
  options.frame_cache = &cache;
  for (uint64_t g = 0; g < 5; ++g) {
    REQUIRE(
        host.Execute(AsHandler(Observe), Frame(x, y, 1, 4100 + g, "a"), options)
            .ok());
    CHECK(budget.used() <= budget.limit());
  }
  CHECK(budget.used() == 2 * one);
}

TEST_CASE("CallFrameCache refuses tables the budget cannot cover",
          "[call_frame][cache][budget]") {
  FfiHost host(FfiHostOptions{1});
  wire::ByteBudget budget(1 << 20);
  REQUIRE(budget.TryTake((1 << 20) - 16));  // other sessions' buffers
  CallFrameCache cache(&budget);
  CallOptions options;
  options.frame_cache = &cache;
  std::vector<float> x = {3}, y = {0};
  g_seen = Seen();
  g_seen.num_args = 12345;  // Observe resets it when called
  absl::Status s =
      host.Execute(AsHandler(Observe), Frame(x, y, 1, 5001, "a"), options);
  CHECK(s.code() == absl::StatusCode::kResourceExhausted);
  const std::string msg(s.message());
  CHECK(msg.find("the launch's attribute tables (call frame cache) needs ") ==
        0);
  CHECK(msg.find("already hold 1048560 of their limit of 1048576 bytes "
                 "(max_buffered_bytes)") != std::string::npos);
  CHECK(g_seen.num_args == 12345);  // the handler did not run
  CHECK(budget.used() == (1 << 20) - 16);
  CHECK(cache.charged_bytes() == 0);
  // Once the other bytes are given back, the same call runs.
  budget.Give((1 << 20) - 16);
  CHECK(host.Execute(AsHandler(Observe), Frame(x, y, 1, 5001, "a"), options)
            .ok());
  CHECK(g_seen.num_args == 1);
}

}  // namespace
}  // namespace kreg
