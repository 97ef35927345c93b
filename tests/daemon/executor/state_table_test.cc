#include "daemon/executor/state_table.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "catch2/catch.hpp"
#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace {

// Deleters run on whichever thread releases a state (two at once below).
std::atomic<int> g_deleted{0};
XLA_FFI_TypeId g_type = {0};
const XLA_FFI_TypeInfo kInfo = {XLA_FFI_TypeInfo_STRUCT_SIZE, nullptr,
                                [](void* p) {
                                  delete static_cast<int*>(p);
                                  ++g_deleted;
                                }};

HostedState NewState() {
  if (g_type.type_id == 0) {
    XLA_FFI_Type_Register_Args args{};
    args.struct_size = XLA_FFI_Type_Register_Args_STRUCT_SIZE;
    const std::string name = "kreg.test.TableState";
    args.name = XLA_FFI_ByteSpan{name.data(), name.size()};
    args.type_id = &g_type;
    args.type_info = &kInfo;
    REQUIRE(HostedApi()->XLA_FFI_Type_Register(&args) == nullptr);
  }
  return HostedState{new int(1), g_type.type_id};
}

const TargetKey kKey{"t", Platform::kCpu};

TEST_CASE("States are owned by their session and shared by its process",
          "[state_table]") {
  g_deleted = 0;
  std::atomic<uint64_t> gauge{0};
  int uncharged = 0;
  {
    StateTable table(2);
    auto a = table.Add(1, 100, NewState(), StateOwner{kKey}, &gauge,
                       [&] { ++uncharged; });
    auto b = table.Add(1, 100, NewState(), StateOwner{kKey}, &gauge, {});
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(gauge == 2);
    // The session's limit: the state offered is destroyed.
    auto c = table.Add(1, 100, NewState(), StateOwner{kKey}, &gauge, {});
    CHECK(c.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK(g_deleted == 1);
    // Another session of the process may use it; another process may not.
    CHECK(table.Get(*a, 100, kKey).ok());
    CHECK(table.Get(*a, 101, kKey).status().code() ==
          absl::StatusCode::kNotFound);
    CHECK(table.Release(*a, 101).code() == absl::StatusCode::kNotFound);
    CHECK(table.Release(*a, 100).ok());
    CHECK(uncharged == 1);
    CHECK(gauge == 1);
    CHECK(g_deleted == 2);
    // Another session's states survive this session's end.
    auto d = table.Add(2, 100, NewState(), StateOwner{kKey}, nullptr, {});
    REQUIRE(d.ok());
    table.ReleaseSession(1);
    CHECK(gauge == 0);
    CHECK(g_deleted == 3);
    CHECK(uncharged == 1);  // kregd gives a closed session's charges back
    CHECK(table.size() == 1);
    CHECK(table.HeldBy(2) == 1);
  }
  CHECK(g_deleted == 4);  // the destructor destroys what is left
}

TEST_CASE(
    "A released state's uncharge runs without the table's lock, and its "
    "session's end waits for it",
    "[state_table]") {
  StateTable table(0);
  std::mutex mu;
  std::condition_variable cv;
  bool in_uncharge = false, may_return = false;
  size_t seen_size = 99;
  auto a = table.Add(1, 100, NewState(), StateOwner{kKey}, nullptr, [&] {
    // The table is usable meanwhile (a round trip to kregd happens here).
    seen_size = table.size();
    std::unique_lock<std::mutex> lock(mu);
    in_uncharge = true;
    cv.notify_all();
    cv.wait(lock, [&] { return may_return; });
  });
  REQUIRE(a.ok());
  REQUIRE(table.Add(1, 100, NewState(), StateOwner{kKey}, nullptr, {}).ok());
  // Released from another session's thread while its own session ends.
  std::thread releaser([&] { CHECK(table.Release(*a, 100).ok()); });
  {
    std::unique_lock<std::mutex> lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(60),
                        [&] { return in_uncharge; }));
  }
  CHECK(seen_size == 1);
  std::atomic<bool> ended{false};
  std::thread ender([&] {
    table.ReleaseSession(1);
    ended = true;
  });
  // Not before the uncharge returned (a bounded look: it can only miss).
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK_FALSE(ended.load());
  {
    std::lock_guard<std::mutex> lock(mu);
    may_return = true;
  }
  cv.notify_all();
  releaser.join();
  ender.join();
  CHECK(ended.load());
  CHECK(table.size() == 0);
  CHECK(table.HeldBy(1) == 0);
}

}  // namespace
}  // namespace kreg
