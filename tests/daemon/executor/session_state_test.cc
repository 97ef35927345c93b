// Handler bundles in a session (docs/kernel-author-guide.md, "Handler
// bundles and state"): Instantiate runs the bundle's instantiate stage and
// keeps its state under a handle, launches carrying the handle get the
// state, ReleaseState and the session's end destroy it, and every refusal
// says what was wrong.
#include <cstdint>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "daemon/executor/ffi/ffi_host.h"
#include "daemon/executor/session.h"
#include "daemon/executor/state_table.h"
#include "tests/daemon/executor/test_util.h"
#include "tests/testing/launch_spec.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace {

// The state type of this test: an int64 counter; deletions are counted.
int g_deleted = 0;
XLA_FFI_TypeId g_type_id = {0};
const XLA_FFI_TypeInfo kTypeInfo = {XLA_FFI_TypeInfo_STRUCT_SIZE, nullptr,
                                    [](void* p) {
                                      delete static_cast<int64_t*>(p);
                                      ++g_deleted;
                                    }};

int64_t TypeId() {
  if (g_type_id.type_id == 0) {
    XLA_FFI_Type_Register_Args args{};
    args.struct_size = XLA_FFI_Type_Register_Args_STRUCT_SIZE;
    const std::string name = "kreg.test.SessionState";
    args.name = XLA_FFI_ByteSpan{name.data(), name.size()};
    args.type_id = &g_type_id;
    args.type_info = &kTypeInfo;
    REQUIRE(HostedApi()->XLA_FFI_Type_Register(&args) == nullptr);
  }
  return g_type_id.type_id;
}

void* const kInstantiateFn = reinterpret_cast<void*>(0x10);
void* const kExecuteFn = reinterpret_cast<void*>(0x20);

// "bundle": instantiate (a counter from attr-less calls; "fail.init": its
// instantiate fails) and execute (adds the state's counter into ret 0);
// "plain": execute only. Charges are counted; `uid_limit` refuses more.
class BundleBackend : public SessionBackend {
 public:
  absl::StatusOr<ResolvedHandler> Lookup(const TargetKey& key,
                                         uint32_t) override {
    return ResolvedHandler{kExecuteFn, 0};
  }
  absl::StatusOr<ResolvedBundle> LookupBundle(const TargetKey& key,
                                              uint32_t) override {
    ResolvedBundle b;
    b.stages[kExecute] = kExecuteFn;
    if (key.name != "plain") b.stages[kInstantiate] = kInstantiateFn;
    b.token = key.name == "fail.init" ? 9 : 3;
    return b;
  }
  absl::Status Execute(void* handler, const LaunchFrame& frame) override {
    return ExecuteWith(handler, frame, CallOptions());
  }
  absl::Status ExecuteWith(void* handler, const LaunchFrame& frame,
                           const CallOptions& options) override {
    ++calls;
    if (handler == kInstantiateFn) {
      if (options.stage != XLA_FFI_ExecutionStage_INSTANTIATE) {
        return absl::InternalError("instantiate run at another stage");
      }
      // What State_Set does: the made state goes to state_out.
      *options.state_out = HostedState{new int64_t(40), TypeId()};
      if (fail_instantiate) return absl::InternalError("instantiate failed");
      return absl::OkStatus();
    }
    if (options.state.ptr == nullptr) {
      return absl::FailedPreconditionError("no state");
    }
    auto* counter = static_cast<int64_t*>(options.state.ptr);
    *counter += 1;
    static_cast<float*>(frame.rets[0].data)[0] = static_cast<float>(*counter);
    return absl::OkStatus();
  }
  absl::Status ChargeState(int delta) override {
    if (delta > 0 && charged >= uid_limit) {
      return absl::ResourceExhaustedError("uid 1 holds 2 handler states");
    }
    charged += delta;
    return absl::OkStatus();
  }
  uint32_t ffi_api_major() const override { return 0; }
  uint32_t ffi_api_minor() const override { return 4; }
  int calls = 0;
  int charged = 0;
  int uid_limit = 100;
  bool fail_instantiate = false;
};

SessionLimits Limits(uint64_t max_states) {
  SessionLimits l;
  l.max_arena_bytes = 1 << 20;
  l.max_states_per_session = max_states;
  return l;
}

v1::SessionRequest Instantiate(const std::string& target,
                               bool with_buffer = false) {
  testing::LaunchSpec l;
  l.set_target_name(target);
  l.set_platform("cpu");
  if (with_buffer) {
    auto* b = l.add_args();
    b->set_dtype(XLA_FFI_DataType_F32);
    b->add_dims(1);
    b->set_size(4);
  }
  v1::SessionRequest r;
  r.mutable_instantiate()->set_descriptor(testing::EncodeSpec(l));
  return r;
}

v1::SessionRequest StatefulLaunch(const std::string& target, uint64_t state) {
  testing::LaunchSpec l;
  l.set_target_name(target);
  l.set_platform("cpu");
  l.set_state(state);
  auto* r = l.add_rets();
  r->set_dtype(XLA_FFI_DataType_F32);
  r->add_dims(1);
  r->set_size(4);
  return testing::LaunchRequest(l, 9);
}

v1::SessionRequest Release(uint64_t state) {
  v1::SessionRequest r;
  r.mutable_release_state()->set_state(state);
  return r;
}

// Gives `session` a 4096-byte arena.
void GrowArena(Session& session) {
  v1::SessionRequest grow;
  grow.mutable_arena_grow()->set_size(4096);
  std::vector<UniqueFd> fds;
  fds.push_back(testing::MakeMemfd(4096));
  REQUIRE(session.Handle(grow, std::move(fds)).arena_grow().size() == 4096);
}

struct Fixture {
  explicit Fixture(uint64_t max_states = 8)
      : session(7, UniqueFd(), PeerCred{1, 2, 3}, Limits(max_states), &backend,
                &counters) {
    v1::SessionRequest hello;
    hello.mutable_hello()->set_protocol_major(kSessionProtocolMajor);
    hello.mutable_hello()->set_protocol_minor(kSessionProtocolMinor);
    REQUIRE(session.Handle(hello, {}).status().code() == 0);
  }
  v1::SessionResponse Send(const v1::SessionRequest& r) {
    return session.Handle(r, {});
  }
  BundleBackend backend;
  SessionCounters counters;
  Session session;
};

TEST_CASE("Instantiate keeps a state that the call site's launches get",
          "[session][state]") {
  g_deleted = 0;
  {
    Fixture fx;
    GrowArena(fx.session);
    v1::SessionResponse a = fx.Send(Instantiate("bundle"));
    REQUIRE(a.status().code() == 0);
    v1::SessionResponse b = fx.Send(Instantiate("bundle"));
    REQUIRE(b.status().code() == 0);
    const uint64_t first = a.instantiate().state();
    const uint64_t second = b.instantiate().state();
    CHECK(first != 0);
    CHECK(first != second);
    CHECK(fx.backend.charged == 2);
    // Each call site counts on its own state.
    CHECK(fx.Send(StatefulLaunch("bundle", first)).status().code() == 0);
    CHECK(fx.Send(StatefulLaunch("bundle", first)).status().code() == 0);
    CHECK(fx.Send(StatefulLaunch("bundle", second)).status().code() == 0);
    // Released: destroyed, its charge given back, and gone.
    CHECK(fx.Send(Release(first)).status().code() == 0);
    CHECK(g_deleted == 1);
    CHECK(fx.backend.charged == 1);
    v1::SessionResponse gone = fx.Send(StatefulLaunch("bundle", first));
    CHECK(gone.status().code() == int(absl::StatusCode::kNotFound));
    CHECK_THAT(gone.status().message(),
               Catch::StartsWith("target \"bundle\": no session of this "
                                 "process holds state "));
    v1::SessionResponse again = fx.Send(Release(first));
    CHECK(again.status().code() == int(absl::StatusCode::kNotFound));
    CHECK(again.status().message() ==
          "no session of this process holds state " + std::to_string(first));
    // A state belongs to its target.
    v1::SessionResponse other = fx.Send(StatefulLaunch("other", second));
    CHECK(other.status().code() == int(absl::StatusCode::kInvalidArgument));
    CHECK_THAT(other.status().message(),
               Catch::Contains("belongs to target \"bundle\", not \"other\""));
  }
  // The session's end destroys what it still held.
  CHECK(g_deleted == 2);
}

TEST_CASE("Instantiate refusals say what was wrong", "[session][state]") {
  Fixture fx(/*max_states=*/1);
  v1::SessionResponse r = fx.Send(Instantiate("plain"));
  CHECK(r.status().code() == int(absl::StatusCode::kFailedPrecondition));
  CHECK_THAT(r.status().message(),
             Catch::StartsWith("target \"plain\" (cpu) has no instantiate "
                               "stage; register it as a handler bundle"));
  GrowArena(fx.session);  // the buffer is valid, but not wanted
  r = fx.Send(Instantiate("bundle", /*with_buffer=*/true));
  CHECK(r.status().code() == int(absl::StatusCode::kInvalidArgument));
  CHECK(r.status().message() ==
        "the Instantiate of \"bundle\" carries 1 argument(s) and 0 "
        "result(s); the instantiate stage takes attributes only");
  v1::SessionRequest bad;
  bad.mutable_instantiate()->set_descriptor("short");
  r = fx.Send(bad);
  CHECK(r.status().code() == int(absl::StatusCode::kInvalidArgument));
  CHECK_THAT(r.status().message(), Catch::Contains("shorter than its"));
  // The uid's account refuses before the handler runs.
  fx.backend.uid_limit = 0;
  const int calls = fx.backend.calls;
  r = fx.Send(Instantiate("bundle"));
  CHECK(r.status().code() == int(absl::StatusCode::kResourceExhausted));
  CHECK(fx.backend.calls == calls);
  fx.backend.uid_limit = 100;
  // A failing instantiate keeps nothing and gives its charge back.
  fx.backend.fail_instantiate = true;
  g_deleted = 0;
  r = fx.Send(Instantiate("fail.init"));
  CHECK(r.status().message() == "instantiate failed");
  CHECK(g_deleted == 1);
  CHECK(fx.backend.charged == 0);
  fx.backend.fail_instantiate = false;
  // The session's limit, before the handler runs.
  REQUIRE(fx.Send(Instantiate("bundle")).status().code() == 0);
  const int before = fx.backend.calls;
  r = fx.Send(Instantiate("bundle"));
  CHECK(r.status().code() == int(absl::StatusCode::kResourceExhausted));
  CHECK_THAT(r.status().message(),
             Catch::Contains("its limit (max_states_per_session = 1)"));
  CHECK(fx.backend.calls == before);
  CHECK(fx.backend.charged == 1);
}

}  // namespace
}  // namespace kreg
