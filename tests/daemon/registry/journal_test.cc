#include "daemon/registry/journal.h"

#include <zlib.h>

#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

#include "catch2/catch.hpp"
#include "kreg/v1/journal.pb.h"
#include "tests/testing/temp_dir.h"

namespace kreg {
namespace {

TargetEntry Entry(const std::string& name) {
  TargetEntry e;
  e.key = {name, Platform::kCpu};
  e.func_name = "Scale";
  e.content_id = "sha256:" + std::string(64, 'a');
  e.module_digest = e.content_id;
  e.registered_by = {1000, 1000, 42};
  e.origin = "upload:10 bytes";
  return e;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void WriteAll(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
}

// Appends `record` to the journal file at `path`, framed as Journal frames
// it (length, CRC-32 of the payload, payload), bypassing Journal's checks.
void AppendFramed(const std::string& path, const v1::JournalRecord& record) {
  std::string payload = record.SerializeAsString();
  uint32_t len = static_cast<uint32_t>(payload.size());
  uint32_t crc = static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(payload.data()), len));
  std::string data = ReadAll(path);
  data.append(reinterpret_cast<const char*>(&len), 4);
  data.append(reinterpret_cast<const char*>(&crc), 4);
  data += payload;
  WriteAll(path, data);
}

TEST_CASE("Journal round-trips records across reopen", "[journal]") {
  testing::TempDir dir;
  std::string path = dir.path() + "/journal";
  {
    Journal j(path);
    REQUIRE(j.Open().ok());
    REQUIRE(j.Append(Entry("a")).ok());
    REQUIRE(j.Append(Entry("b")).ok());
  }
  Journal j(path);
  auto entries = j.Open();
  REQUIRE(entries.ok());
  REQUIRE(entries->size() == 2);
  CHECK((*entries)[1].key.name == "b");
  CHECK((*entries)[0].registered_by.pid == 42);
  CHECK((*entries)[0].origin == "upload:10 bytes");
  CHECK(j.torn_bytes() == 0);
}

TEST_CASE("Journal replays a replaced target as its last generation",
          "[journal][replace]") {
  testing::TempDir dir;
  std::string path = dir.path() + "/journal";
  TargetEntry first = Entry("a");
  TargetEntry second = first;
  second.generation = 2;
  second.content_id = "sha256:" + std::string(64, 'b');
  second.module_digest = second.content_id;
  second.generations = {
      Generation{1, first.content_id, first.module_digest, 10, "Scale",
                 HandlerInfo{0, 4, 0, 0}, first.registered_by, 5, "upload"},
      Generation{2, second.content_id, second.module_digest, 11, "Scale",
                 HandlerInfo{0, 5, 1, 0}, PeerCred{0, 0, 7}, 6, "path:/m"}};
  {
    Journal j(path);
    REQUIRE(j.Open().ok());
    REQUIRE(j.Append(first).ok());
    REQUIRE(j.Append(Entry("b")).ok());
    REQUIRE(j.Append(second).ok());
  }
  Journal j(path);
  auto entries = j.Open();
  REQUIRE(entries.ok());
  REQUIRE(entries->size() == 2);
  const TargetEntry& a = (*entries)[0];
  CHECK(a.key.name == "a");
  CHECK(a.generation == 2);
  CHECK(a.module_digest == second.module_digest);
  CHECK(a.registered_by.uid == 1000);
  REQUIRE(a.generations.size() == 2);
  CHECK(a.generations[0].module_digest == first.module_digest);
  CHECK(a.generations[1].by.pid == 7);
  CHECK(a.generations[1].handler_info.traits == 1);
  CHECK(a.generations[1].origin == "path:/m");
  CHECK((*entries)[1].generation == 1);  // a record without one
  CHECK((*entries)[1].generations.empty());
}

TEST_CASE("Journal append before open fails", "[journal]") {
  testing::TempDir dir;
  Journal j(dir.path() + "/journal");
  CHECK(j.Append(Entry("a")).code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("Journal ignores and truncates a torn last record", "[journal]") {
  testing::TempDir dir;
  std::string path = dir.path() + "/journal";
  {
    Journal j(path);
    REQUIRE(j.Open().ok());
    REQUIRE(j.Append(Entry("a")).ok());
    REQUIRE(j.Append(Entry("b")).ok());
  }
  std::string data = ReadAll(path);
  WriteAll(path, data.substr(0, data.size() - 5));
  Journal j(path);
  auto entries = j.Open();
  REQUIRE(entries.ok());
  REQUIRE(entries->size() == 1);
  CHECK(j.torn_bytes() > 0);
  // Appending after the cut leaves a clean journal.
  REQUIRE(j.Append(Entry("c")).ok());
  Journal again(path);
  auto after = again.Open();
  REQUIRE(after.ok());
  REQUIRE(after->size() == 2);
  CHECK((*after)[1].key.name == "c");
}

TEST_CASE("Journal ignores a last record with a bad checksum", "[journal]") {
  testing::TempDir dir;
  std::string path = dir.path() + "/journal";
  {
    Journal j(path);
    REQUIRE(j.Open().ok());
    REQUIRE(j.Append(Entry("a")).ok());
    REQUIRE(j.Append(Entry("b")).ok());
  }
  std::string data = ReadAll(path);
  data.back() ^= 0x5a;
  WriteAll(path, data);
  Journal j(path);
  auto entries = j.Open();
  REQUIRE(entries.ok());
  CHECK(entries->size() == 1);
}

TEST_CASE("Journal refuses a corrupt record in the middle", "[journal]") {
  testing::TempDir dir;
  std::string path = dir.path() + "/journal";
  {
    Journal j(path);
    REQUIRE(j.Open().ok());
    REQUIRE(j.Append(Entry("a")).ok());
    REQUIRE(j.Append(Entry("b")).ok());
  }
  std::string data = ReadAll(path);
  data[12] ^= 0x5a;  // inside the first record's payload
  WriteAll(path, data);
  Journal j(path);
  auto entries = j.Open();
  REQUIRE(entries.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(entries.status().message()),
             Catch::Contains("corrupt record at byte 0") &&
                 Catch::Contains("Restore the journal"));
}

TEST_CASE("Journal refuses a record with an invalid target name", "[journal]") {
  testing::TempDir dir;
  std::string path = dir.path() + "/journal";
  {
    Journal j(path);
    REQUIRE(j.Open().ok());
    REQUIRE(j.Append(Entry("9bad name")).ok());
  }
  Journal j(path);
  auto entries = j.Open();
  REQUIRE(entries.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(entries.status().message()),
             Catch::Contains("9bad name"));
}

Retirement Retired(const std::string& name) {
  Retirement r;
  r.key = {name, Platform::kCpu};
  r.content_id = r.module_digest = "sha256:" + std::string(64, 'a');
  r.retired_by = {1000, 1000, 43};
  r.retired_at_us = 1234;
  return r;
}

TEST_CASE("Journal replays a retirement: the name is free again",
          "[journal][retire]") {
  testing::TempDir dir;
  std::string path = dir.path() + "/journal";
  {
    Journal j(path);
    REQUIRE(j.Open().ok());
    REQUIRE(j.Append(Entry("a")).ok());
    REQUIRE(j.Append(Entry("b")).ok());
    REQUIRE(j.AppendRetirement(Retired("a")).ok());
  }
  {
    Journal j(path);
    auto entries = j.Open();
    REQUIRE(entries.ok());
    REQUIRE(entries->size() == 1);
    CHECK((*entries)[0].key.name == "b");
    // Registered again after the retirement, with other content.
    TargetEntry again = Entry("a");
    again.content_id = again.module_digest = "sha256:" + std::string(64, 'b');
    REQUIRE(j.Append(again).ok());
  }
  Journal j(path);
  auto entries = j.Open();
  REQUIRE(entries.ok());
  REQUIRE(entries->size() == 2);
  CHECK((*entries)[1].key.name == "a");
  CHECK((*entries)[1].content_id == "sha256:" + std::string(64, 'b'));
}

TEST_CASE("Journal retirement records carry who and when",
          "[journal][retire]") {
  testing::TempDir dir;
  std::string path = dir.path() + "/journal";
  Journal j(path);
  REQUIRE(j.Open().ok());
  REQUIRE(j.AppendRetirement(Retired("a")).ok());
  std::string data = ReadAll(path);
  v1::JournalRecord record;
  REQUIRE(record.ParseFromString(data.substr(8)));
  REQUIRE(record.has_retirement());
  CHECK(record.retirement().target_name() == "a");
  CHECK(record.retirement().platform() == "cpu");
  CHECK(record.retirement().uid() == 1000);
  CHECK(record.retirement().pid() == 43);
  CHECK(record.retirement().retired_at_us() == 1234);
  // A retirement of a name never registered is ignored (logged).
  Journal again(path);
  auto entries = again.Open();
  REQUIRE(entries.ok());
  CHECK(entries->empty());
}

TEST_CASE("Journal refuses a retirement with a bad platform",
          "[journal][retire]") {
  testing::TempDir dir;
  std::string path = dir.path() + "/journal";
  {
    Journal j(path);
    REQUIRE(j.Open().ok());
    REQUIRE(j.Append(Entry("a")).ok());
  }
  // A retirement record for platform "tpu", framed as Journal frames it.
  v1::JournalRecord record;
  record.mutable_retirement()->set_target_name("a");
  record.mutable_retirement()->set_platform("tpu");
  AppendFramed(path, record);
  Journal j(path);
  auto entries = j.Open();
  REQUIRE(entries.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(entries.status().message()), Catch::Contains("tpu"));
}

CrashRecord Quarantine(const std::string& name, uid_t uid, bool on) {
  CrashRecord q;
  q.key = {name, Platform::kCpu};
  q.uid = uid;
  q.quarantined = on;
  q.crashes_in_window = 3;
  q.crashes_total = 5;
  q.last_reason = "SIGSEGV";
  q.last_crash_unix_s = 1700000000;
  return q;
}

TEST_CASE("Journal replays quarantines: the last record of a target wins",
          "[journal][quarantine]") {
  testing::TempDir dir;
  std::string path = dir.path() + "/journal";
  {
    Journal j(path);
    REQUIRE(j.Open().ok());
    CHECK(j.quarantines().empty());
    REQUIRE(j.Append(Entry("a")).ok());
    REQUIRE(j.AppendQuarantine(Quarantine("a", 1000, true)).ok());
    REQUIRE(j.AppendQuarantine(Quarantine("a", 1001, true)).ok());
    REQUIRE(j.AppendQuarantine(Quarantine("b", 1000, true)).ok());
    REQUIRE(j.AppendQuarantine(Quarantine("b", 1000, false)).ok());  // lifted
  }
  Journal j(path);
  auto entries = j.Open();
  REQUIRE(entries.ok());
  CHECK(entries->size() == 1);  // quarantines are no registrations
  REQUIRE(j.quarantines().size() == 2);
  const CrashRecord& q = j.quarantines()[0];
  CHECK(q.key.name == "a");
  CHECK(q.uid == 1000);
  CHECK(q.quarantined);
  CHECK(q.crashes_in_window == 3);
  CHECK(q.crashes_total == 5);
  CHECK(q.last_reason == "SIGSEGV");
  CHECK(q.last_crash_unix_s == 1700000000);
  CHECK(j.quarantines()[1].uid == 1001);
  // Lifted after a restart: gone after the next one.
  REQUIRE(j.AppendQuarantine(Quarantine("a", 1000, false)).ok());
  Journal again(path);
  REQUIRE(again.Open().ok());
  REQUIRE(again.quarantines().size() == 1);
  CHECK(again.quarantines()[0].uid == 1001);
}

TEST_CASE("Journal replays reservations: the last record of a pattern wins",
          "[journal][reservations]") {
  testing::TempDir dir;
  std::string path = dir.path() + "/journal";
  NameReservation lib;
  lib.pattern = "lib.*";
  lib.owner = 1000;
  lib.by = PeerCred{0, 0, 7};
  lib.at_us = 1700000000000000;
  NameReservation team = lib;
  team.pattern = "team.*";
  team.group = true;
  team.owner = 50;
  {
    Journal j(path);
    REQUIRE(j.Open().ok());
    REQUIRE(j.Append(Entry("a")).ok());
    REQUIRE(j.AppendReservation(lib, false).ok());
    REQUIRE(j.AppendReservation(team, false).ok());
    REQUIRE(j.AppendReservation(lib, true).ok());  // lifted
    lib.owner = 1001;
    REQUIRE(j.AppendReservation(lib, false).ok());  // made again
  }
  Journal j(path);
  auto entries = j.Open();
  REQUIRE(entries.ok());
  CHECK(entries->size() == 1);  // reservations are no registrations
  REQUIRE(j.reservations().size() == 2);
  CHECK(j.reservations()[0].pattern == "team.*");
  CHECK(j.reservations()[0].group);
  CHECK(j.reservations()[0].owner == 50);
  CHECK(j.reservations()[0].by.pid == 7);
  CHECK(j.reservations()[0].at_us == 1700000000000000);
  CHECK(j.reservations()[1].pattern == "lib.*");
  CHECK(j.reservations()[1].owner == 1001);
}

TEST_CASE("Journal refuses a quarantine record with a bad name or platform",
          "[journal][quarantine]") {
  for (const auto& [name, platform, what] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"a", "tpu", "tpu"}, {"bad name!", "cpu", "bad name!"}}) {
    testing::TempDir dir;
    std::string path = dir.path() + "/journal";
    {
      Journal j(path);
      REQUIRE(j.Open().ok());
    }
    v1::JournalRecord record;
    record.mutable_quarantine()->set_target_name(name);
    record.mutable_quarantine()->set_platform(platform);
    record.mutable_quarantine()->set_quarantined(true);
    AppendFramed(path, record);
    Journal j(path);
    auto entries = j.Open();
    REQUIRE(entries.status().code() == absl::StatusCode::kDataLoss);
    CHECK_THAT(std::string(entries.status().message()),
               Catch::Contains("record at byte 0") && Catch::Contains(what));
  }
}

}  // namespace
}  // namespace kreg
