#include "daemon/executor/repoint_table.h"

#include "catch2/catch.hpp"

namespace kreg {
namespace {

void* H(uintptr_t v) { return reinterpret_cast<void*>(v); }

TEST_CASE("RepointTable keeps the latest generation and counts changes",
          "[repoint]") {
  RepointTable table;
  const TargetKey op{"op", Platform::kCpu};
  CHECK_FALSE(table.Find(op).has_value());
  CHECK(table.epoch() == 0);
  CHECK(table.Set(op, 2, H(2), 7));
  CHECK(table.epoch() == 1);
  REQUIRE(table.Find(op).has_value());
  CHECK(table.Find(op)->generation == 2);
  CHECK(table.Find(op)->handler == H(2));
  CHECK(table.Find(op)->token == 7);
  // A late message for an older or the same generation changes nothing.
  CHECK_FALSE(table.Set(op, 1, H(1), 1));
  CHECK_FALSE(table.Set(op, 2, H(9), 9));
  CHECK(table.Find(op)->handler == H(2));
  CHECK(table.Find(op)->token == 7);
  CHECK(table.epoch() == 1);
  CHECK(table.Set(op, 3, H(3), 8));
  CHECK(table.epoch() == 2);
  // Keys are (name, platform).
  CHECK_FALSE(table.Find({"op", Platform::kCuda}).has_value());
}

}  // namespace
}  // namespace kreg
