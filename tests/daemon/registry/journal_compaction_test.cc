// Journal: replacements as deltas, compaction, and replay to the same state
// (docs/replace.md section 2; operator guide, "State, backup, upgrades").
#include <zlib.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "daemon/registry/journal.h"
#include "daemon/registry/target_proto.h"
#include "kreg/v1/journal.pb.h"
#include "tests/testing/temp_dir.h"

namespace kreg {
namespace {

std::string Digest(char c) { return "sha256:" + std::string(64, c); }

TargetEntry Entry(const std::string& name) {
  TargetEntry e;
  e.key = {name, Platform::kCpu};
  e.func_name = "Scale";
  e.content_id = e.module_digest = Digest('a');
  e.module_size = 10;
  e.registered_by = {1000, 1000, 42};
  e.registered_at_us = 5;
  e.origin = "upload:10 bytes";
  return e;
}

Generation Gen(uint32_t n) {
  const std::string d = Digest(static_cast<char>('a' + n % 26));
  return Generation{n,
                    d,
                    d,
                    10 + n,
                    "Scale",
                    HandlerInfo{0, 4, 0, 0},
                    PeerCred{1000, 1000, static_cast<pid_t>(100 + n)},
                    static_cast<int64_t>(n),
                    "upload:10 bytes"};
}

// `e` at generation `n`, whose live generations are `live` (ascending, `n`
// last), as Registry::Replace makes it.
TargetEntry At(TargetEntry e, uint32_t n, const std::vector<uint32_t>& live) {
  e.generation = n;
  e.content_id = e.module_digest = Gen(n).module_digest;
  e.module_size = Gen(n).module_size;
  e.generations.clear();
  for (uint32_t g : live) e.generations.push_back(Gen(g));
  return e;
}

std::string Text(const TargetEntry& e) { return ToProto(e).DebugString(); }
std::string Text(const std::vector<TargetEntry>& entries) {
  std::string out;
  for (const TargetEntry& e : entries) out += Text(e) + "--\n";
  return out;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Every record of the journal file (a torn tail left out).
std::vector<v1::JournalRecord> Records(const std::string& path) {
  const std::string data = ReadAll(path);
  std::vector<v1::JournalRecord> out;
  size_t pos = 0;
  while (pos + 8 <= data.size()) {
    uint32_t len;
    std::memcpy(&len, data.data() + pos, 4);
    if (pos + 8 + len > data.size()) break;
    v1::JournalRecord r;
    REQUIRE(r.ParseFromArray(data.data() + pos + 8, static_cast<int>(len)));
    out.push_back(r);
    pos += 8 + len;
  }
  return out;
}

void AppendFramed(const std::string& path, const v1::JournalRecord& record) {
  std::string payload = record.SerializeAsString();
  uint32_t len = static_cast<uint32_t>(payload.size());
  uint32_t crc = static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(payload.data()), len));
  std::ofstream out(path, std::ios::binary | std::ios::app);
  out.write(reinterpret_cast<const char*>(&len), 4);
  out.write(reinterpret_cast<const char*>(&crc), 4);
  out << payload;
}

// Replaces "a" `n` times keeping the replaced generation and generation 1
// (as if pinned): the journal's entry and what the registry had.
TargetEntry ReplaceMany(Journal* j, int n) {
  TargetEntry last = Entry("a");
  REQUIRE(j->Append(last).ok());
  for (uint32_t g = 2; g <= static_cast<uint32_t>(n) + 1; ++g) {
    std::vector<uint32_t> live = {1};
    if (g > 2) live.push_back(g - 1);
    live.push_back(g);
    last = At(Entry("a"), g, live);
    REQUIRE(j->Append(last).ok());
  }
  return last;
}

TEST_CASE("Journal writes a replacement as a delta of the record before it",
          "[journal][generations]") {
  testing::TempDir dir;
  const std::string path = dir.path() + "/journal";
  JournalOptions never;
  never.compact_min_dead_bytes = UINT64_MAX;
  Journal j(path, never);
  REQUIRE(j.Open().ok());
  const TargetEntry last = ReplaceMany(&j, 40);
  std::vector<v1::JournalRecord> records = Records(path);
  REQUIRE(records.size() == 41);
  CHECK(records[0].has_target());
  // The first replacement brings generations 1 and 2; each later one only
  // its own, keeping 1 and the one it replaced.
  REQUIRE(records[1].has_generation());
  CHECK(records[1].generation().target().generations_size() == 2);
  CHECK(records[1].generation().kept_size() == 0);
  const v1::GenerationRecord& d = records.back().generation();
  REQUIRE(d.target().generations_size() == 1);
  CHECK(d.target().generations(0).generation() == 41);
  CHECK(std::vector<uint32_t>(d.kept().begin(), d.kept().end()) ==
        std::vector<uint32_t>{1, 40});
  // The journal grows by a constant per replacement, not by the number of
  // generations ever made.
  const size_t first = records[2].ByteSizeLong();
  CHECK(records.back().ByteSizeLong() <= first + 8);
  // Replay gives what was appended.
  Journal again(path, never);
  auto entries = again.Open();
  REQUIRE(entries.ok());
  REQUIRE(entries->size() == 1);
  CHECK(Text((*entries)[0]) == Text(last));
}

TEST_CASE("Journal compacts once dead bytes pass the threshold",
          "[journal][generations]") {
  testing::TempDir dir;
  const std::string path = dir.path() + "/journal";
  JournalOptions small;
  small.compact_min_dead_bytes = 2048;
  Journal j(path, small);
  REQUIRE(j.Open().ok());
  REQUIRE(j.Append(Entry("b")).ok());
  CrashRecord q;
  q.key = {"b", Platform::kCpu};
  q.uid = 1001;
  q.quarantined = true;
  q.crashes_total = 3;
  q.last_reason = "SIGSEGV";
  REQUIRE(j.AppendQuarantine(q).ok());
  NameReservation r;
  r.pattern = "team.*";
  r.owner = 1000;
  r.by = {0, 0, 9};
  REQUIRE(j.AppendReservation(r, false).ok());
  NameReservation lifted = r;
  lifted.pattern = "gone.*";
  REQUIRE(j.AppendReservation(lifted, false).ok());
  REQUIRE(j.AppendReservation(lifted, true).ok());
  REQUIRE(j.Append(Entry("c")).ok());
  Retirement ret;
  ret.key = {"c", Platform::kCpu};
  REQUIRE(j.AppendRetirement(ret).ok());
  uint64_t largest = 0;
  TargetEntry last = Entry("a");
  REQUIRE(j.Append(last).ok());
  for (uint32_t g = 2; g <= 200; ++g) {
    last = At(Entry("a"), g, {g - 1, g});
    REQUIRE(j.Append(last).ok());
    largest = std::max(largest, j.sizes().file_bytes);
    // The file matches what the journal counts.
    REQUIRE(ReadAll(path).size() == j.sizes().file_bytes);
  }
  const Journal::Sizes sizes = j.sizes();
  CHECK(sizes.compactions > 0);
  // Bounded: twice the live state plus the threshold, and one record.
  CHECK(largest <= 2 * sizes.live_bytes + 2048 + 1024);
  // The compacted file holds one record per thing in effect.
  REQUIRE(j.Compact().ok());
  CHECK(j.sizes().file_bytes == j.sizes().live_bytes);
  std::vector<v1::JournalRecord> records = Records(path);
  CHECK(records.size() == 4);  // b, a, the quarantine, team.*
  // A restart replays the same state, and appends go on after it.
  Journal again(path, small);
  auto entries = again.Open();
  REQUIRE(entries.ok());
  REQUIRE(entries->size() == 2);
  CHECK(Text((*entries)[0]) == Text(Entry("b")));
  CHECK(Text((*entries)[1]) == Text(last));
  REQUIRE(again.quarantines().size() == 1);
  CHECK(again.quarantines()[0].last_reason == "SIGSEGV");
  CHECK(again.quarantines()[0].crashes_total == 3);
  REQUIRE(again.reservations().size() == 1);
  CHECK(again.reservations()[0].pattern == "team.*");
  CHECK(again.sizes().compactions == 0);
  const TargetEntry next = At(Entry("a"), 201, {200, 201});
  REQUIRE(again.Append(next).ok());
  Journal third(path, small);
  auto after = third.Open();
  REQUIRE(after.ok());
  CHECK(Text(*after) == Text({Entry("b"), next}));
}

TEST_CASE("Journal compacts at start-up, also a journal of full records",
          "[journal][generations]") {
  testing::TempDir dir;
  const std::string path = dir.path() + "/journal";
  // As an older kregd wrote it: every record repeats every generation.
  std::vector<uint32_t> live;
  TargetEntry last;
  for (uint32_t g = 1; g <= 60; ++g) {
    live.push_back(g);
    last = g == 1 ? Entry("a") : At(Entry("a"), g, live);
    v1::JournalRecord record;
    *record.mutable_target() = ToProto(last);
    AppendFramed(path, record);
  }
  const size_t before = ReadAll(path).size();
  Journal j(path);  // the default threshold
  auto entries = j.Open();
  REQUIRE(entries.ok());
  CHECK(j.sizes().compactions == 1);
  CHECK(ReadAll(path).size() == j.sizes().live_bytes);
  CHECK(ReadAll(path).size() < before / 10);
  REQUIRE(entries->size() == 1);
  CHECK(Text((*entries)[0]) == Text(last));
  Journal again(path);
  auto replayed = again.Open();
  REQUIRE(replayed.ok());
  CHECK(Text(*replayed) == Text(*entries));
  CHECK(again.sizes().compactions == 0);
}

TEST_CASE("Journal ignores a torn replacement record at the end",
          "[journal][generations]") {
  testing::TempDir dir;
  const std::string path = dir.path() + "/journal";
  const TargetEntry second = At(Entry("a"), 2, {1, 2});
  {
    Journal j(path);
    REQUIRE(j.Open().ok());
    REQUIRE(j.Append(Entry("a")).ok());
    REQUIRE(j.Append(second).ok());
    REQUIRE(j.Append(At(Entry("a"), 3, {2, 3})).ok());
  }
  const std::string data = ReadAll(path);
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      << data.substr(0, data.size() - 5);
  Journal j(path);
  auto entries = j.Open();
  REQUIRE(entries.ok());
  CHECK(j.torn_bytes() > 0);
  REQUIRE(entries->size() == 1);
  CHECK(Text((*entries)[0]) == Text(second));
  // The next replacement is a delta of generation 2.
  const TargetEntry third = At(Entry("a"), 3, {2, 3});
  REQUIRE(j.Append(third).ok());
  Journal again(path);
  auto after = again.Open();
  REQUIRE(after.ok());
  CHECK(Text(*after) == Text(std::vector<TargetEntry>{third}));
}

TEST_CASE(
    "Journal refuses a replacement record that does not fit the one "
    "before it",
    "[journal][generations]") {
  testing::TempDir dir;
  const std::string path = dir.path() + "/journal";
  {
    Journal j(path);
    REQUIRE(j.Open().ok());
    REQUIRE(j.Append(Entry("a")).ok());
  }
  v1::JournalRecord keeps;
  *keeps.mutable_generation()->mutable_target() =
      ToProto(At(Entry("a"), 3, {3}));
  keeps.mutable_generation()->add_kept(7);
  v1::JournalRecord orphan;
  *orphan.mutable_generation()->mutable_target() =
      ToProto(At(Entry("z"), 2, {2}));
  for (const auto& [record, what] :
       std::vector<std::pair<v1::JournalRecord, std::string>>{
           {keeps,
            "generation 3 of target \"a\" (cpu) keeps generation 7, which "
            "the record before it lacks"},
           {orphan,
            "generation 2 of target \"z\" (cpu) follows no earlier "
            "generation of it"}}) {
    const std::string good = ReadAll(path);
    AppendFramed(path, record);
    AppendFramed(path, record);  // not the last record: no torn tail
    Journal j(path);
    auto entries = j.Open();
    REQUIRE(entries.status().code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(entries.status().message()) ==
          "journal " + path + " record at byte " + std::to_string(good.size()) +
              ": " + what);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << good;
  }
}

}  // namespace
}  // namespace kreg
