// Quarantine changes reach the ledger's sink (kregd: the journal) exactly
// when a row becomes quarantined or is lifted; restored rows stay
// quarantined until lifted.
#include "daemon/supervisor/crash_ledger.h"

#include <utility>
#include <vector>

#include "catch2/catch.hpp"

namespace kreg {
namespace {

const TargetKey kKey{"hostile.Segfault", Platform::kCpu};

struct Sink {
  std::vector<std::pair<CrashRecord, bool>> told;
  CrashLedger::QuarantineSink fn() {
    return [this](const CrashRecord& r, bool q) { told.push_back({r, q}); };
  }
};

TEST_CASE("The sink hears a quarantine once and its lifting once",
          "[crash_ledger]") {
  CrashLedger ledger(CrashPolicy{2, 600});
  Sink sink;
  ledger.SetSink(sink.fn());
  ledger.Record(kKey, 1000, "SIGSEGV", 100);
  CHECK(sink.told.empty());
  CrashRecord r = ledger.Record(kKey, 1000, "SIGSEGV", 101);
  CHECK(r.quarantined);
  REQUIRE(sink.told.size() == 1);
  CHECK(sink.told[0].second);
  CHECK(sink.told[0].first.uid == 1000);
  CHECK(sink.told[0].first.crashes_in_window == 2);
  ledger.Record(kKey, 1000, "SIGSEGV", 102);  // already quarantined
  CHECK(sink.told.size() == 1);
  CHECK(ledger.Unquarantine(kKey.name, std::nullopt, std::nullopt).size() == 1);
  REQUIRE(sink.told.size() == 2);
  CHECK_FALSE(sink.told[1].second);
  // Nothing quarantined: nothing to tell.
  CHECK(ledger.Unquarantine(kKey.name, std::nullopt, std::nullopt).empty());
  CHECK(sink.told.size() == 2);
}

TEST_CASE("A restored quarantine holds until lifted", "[crash_ledger]") {
  CrashLedger ledger(CrashPolicy{3, 600});
  Sink sink;
  CrashRecord row;
  row.key = kKey;
  row.uid = 1000;
  row.crashes_in_window = 3;
  row.last_reason = "SIGSEGV";
  ledger.Restore(row);
  ledger.SetSink(sink.fn());
  CHECK(sink.told.empty());  // restoring is not a change
  std::optional<CrashRecord> q = ledger.Quarantined(kKey, 1000);
  REQUIRE(q.has_value());
  CHECK(q->last_reason == "SIGSEGV");
  CHECK_FALSE(ledger.Quarantined(kKey, 1001).has_value());
  REQUIRE(ledger.Unquarantine(kKey.name, Platform::kCpu, 1000).size() == 1);
  CHECK_FALSE(ledger.Quarantined(kKey, 1000).has_value());
  REQUIRE(sink.told.size() == 1);
  CHECK_FALSE(sink.told[0].second);
}

}  // namespace
}  // namespace kreg
