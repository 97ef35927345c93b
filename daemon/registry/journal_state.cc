// Journal records and the state they put in effect (see journal_state.h).
#include "daemon/registry/journal_state.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "daemon/base/validate.h"
#include "daemon/registry/target_proto.h"
#include "spdlog/spdlog.h"

namespace kreg {

v1::JournalRecord TargetRecordOf(const TargetEntry& e) {
  v1::JournalRecord record;
  *record.mutable_target() = ToProto(e);
  return record;
}

v1::JournalRecord QuarantineRecordOf(const CrashRecord& e) {
  v1::JournalRecord record;
  v1::QuarantineRecord* q = record.mutable_quarantine();
  q->set_target_name(e.key.name);
  q->set_platform(PlatformName(e.key.platform));
  q->set_uid(e.uid);
  q->set_quarantined(e.quarantined);
  q->set_crashes_in_window(
      static_cast<uint32_t>(std::max(0, e.crashes_in_window)));
  q->set_crashes_total(e.crashes_total);
  q->set_last_reason(e.last_reason.substr(0, 4096));
  q->set_last_crash_unix_s(e.last_crash_unix_s);
  return record;
}

v1::JournalRecord ReservationRecordOf(const NameReservation& r, bool lifted) {
  v1::JournalRecord record;
  v1::ReservationRecord* p = record.mutable_reservation();
  p->set_pattern(r.pattern);
  p->set_group(r.group);
  p->set_owner(r.owner);
  p->set_uid(r.by.uid);
  p->set_gid(r.by.gid);
  p->set_pid(r.by.pid);
  p->set_at_us(r.at_us);
  p->set_lifted(lifted);
  return record;
}

namespace {

// What a compaction writes for the state's items (framed).
uint64_t Bytes(const v1::JournalRecord& r) {
  return kJournalHeaderBytes + r.ByteSizeLong();
}
uint64_t BytesOf(const std::vector<TargetEntry>& entries, const TargetKey& k) {
  uint64_t n = 0;
  for (const TargetEntry& e : entries) {
    if (e.key == k) n += Bytes(TargetRecordOf(e));
  }
  return n;
}

// The entry a later generation of `key` replaces (docs/replace.md): the
// first in effect with a lower generation.
TargetEntry* Replaced(std::vector<TargetEntry>* entries, const TargetKey& key,
                      uint32_t generation) {
  for (TargetEntry& e : *entries) {
    if (e.key == key && e.generation < generation) return &e;
  }
  return nullptr;
}

// A later generation of a key in effect (docs/replace.md) takes its place;
// any other record is added (Registry::Restore refuses a second record of
// a key with other content, as a live registration would be).
absl::Status AddEntry(const v1::Target& target,
                      std::vector<TargetEntry>* entries) {
  KREG_ASSIGN_OR_RETURN(TargetEntry entry, FromProto(target));
  if (TargetEntry* e = Replaced(entries, entry.key, entry.generation)) {
    *e = std::move(entry);
    return absl::OkStatus();
  }
  entries->push_back(std::move(entry));
  return absl::OkStatus();
}

// A replacement journaled as a delta: the earlier generations it keeps,
// and the ones it brings.
absl::Status ApplyGenerations(const v1::GenerationRecord& r,
                              std::vector<TargetEntry>* entries) {
  KREG_ASSIGN_OR_RETURN(TargetEntry next, FromProto(r.target()));
  TargetEntry* e = Replaced(entries, next.key, next.generation);
  if (e == nullptr) {
    return absl::DataLossError(
        absl::StrCat("generation ", next.generation, " of ", Named(next.key),
                     " follows no earlier generation of it"));
  }
  std::map<uint32_t, Generation> gens;
  for (uint32_t kept : r.kept()) {
    auto it =
        std::find_if(e->generations.begin(), e->generations.end(),
                     [&](const Generation& g) { return g.generation == kept; });
    if (it == e->generations.end()) {
      return absl::DataLossError(absl::StrCat(
          "generation ", next.generation, " of ", Named(next.key),
          " keeps generation ", kept, ", which the record before it lacks"));
    }
    gens[kept] = *it;
  }
  for (Generation& g : next.generations) {
    const uint32_t n = g.generation;
    if (!gens.emplace(n, std::move(g)).second) {
      return absl::DataLossError(
          absl::StrCat("generation ", n, " of ", Named(next.key), " twice"));
    }
  }
  next.generations.clear();
  for (auto& [n, g] : gens) next.generations.push_back(std::move(g));
  *e = std::move(next);
  return absl::OkStatus();
}

// Drops the registrations of the retired key recorded before it.
absl::Status ApplyRetirement(const v1::RetirementRecord& r,
                             std::vector<TargetEntry>* entries) {
  KREG_ASSIGN_OR_RETURN(Platform platform, ParsePlatform(r.platform()));
  const TargetKey key{r.target_name(), platform};
  size_t before = entries->size();
  entries->erase(
      std::remove_if(entries->begin(), entries->end(),
                     [&](const TargetEntry& e) { return e.key == key; }),
      entries->end());
  if (entries->size() == before) {
    spdlog::warn(
        "journal: retirement of \"{}\" ({}) follows no registration "
        "of it; ignored",
        key.name, PlatformName(key.platform));
  }
  return absl::OkStatus();
}

// Folds a quarantine record into the state in effect: the last record of a
// (target, uid) wins.
absl::Status ApplyQuarantine(const v1::QuarantineRecord& r,
                             std::vector<CrashRecord>* in_effect,
                             uint64_t* live) {
  KREG_RETURN_IF_ERROR(ValidateTargetName(r.target_name()));
  KREG_ASSIGN_OR_RETURN(Platform platform, ParsePlatform(r.platform()));
  CrashRecord e;
  e.key = {r.target_name(), platform};
  e.uid = r.uid();
  e.quarantined = r.quarantined();
  e.crashes_in_window =
      static_cast<int>(std::min<uint32_t>(r.crashes_in_window(), 1u << 30));
  e.crashes_total = r.crashes_total();
  e.last_reason = r.last_reason();
  e.last_crash_unix_s = r.last_crash_unix_s();
  auto same = [&](const CrashRecord& q) {
    return q.key == e.key && q.uid == e.uid;
  };
  for (const CrashRecord& q : *in_effect) {
    if (same(q)) *live -= Bytes(QuarantineRecordOf(q));
  }
  in_effect->erase(std::remove_if(in_effect->begin(), in_effect->end(), same),
                   in_effect->end());
  if (e.quarantined) {
    *live += Bytes(QuarantineRecordOf(e));
    in_effect->push_back(std::move(e));
  }
  return absl::OkStatus();
}

// The last record of a pattern decides.
absl::Status ApplyReservation(const v1::ReservationRecord& r,
                              std::vector<NameReservation>* in_effect,
                              uint64_t* live) {
  auto same = [&](const NameReservation& e) {
    return e.pattern == r.pattern();
  };
  for (const NameReservation& e : *in_effect) {
    if (same(e)) *live -= Bytes(ReservationRecordOf(e, false));
  }
  in_effect->erase(std::remove_if(in_effect->begin(), in_effect->end(), same),
                   in_effect->end());
  if (r.lifted()) return absl::OkStatus();
  NameReservation e;
  e.pattern = r.pattern();
  e.group = r.group();
  e.owner = r.owner();
  e.by = PeerCred{r.uid(), r.gid(), r.pid()};
  e.at_us = r.at_us();
  *live += Bytes(ReservationRecordOf(e, false));
  in_effect->push_back(std::move(e));
  return absl::OkStatus();
}

// The key a registration, replacement or retirement record is about.
absl::StatusOr<TargetKey> KeyOf(const v1::JournalRecord& r) {
  const std::string& name = r.has_retirement() ? r.retirement().target_name()
                            : r.has_generation()
                                ? r.generation().target().target_name()
                                : r.target().target_name();
  const std::string& platform = r.has_retirement() ? r.retirement().platform()
                                : r.has_generation()
                                    ? r.generation().target().platform()
                                    : r.target().platform();
  KREG_ASSIGN_OR_RETURN(Platform p, ParsePlatform(platform));
  return TargetKey{name, p};
}

// Folds one record into `state`, keeping `*live` (the bytes a compaction
// of `state` writes) current.
absl::Status Apply(const v1::JournalRecord& record, JournalState* state,
                   uint64_t* live) {
  if (record.has_quarantine()) {
    return ApplyQuarantine(record.quarantine(), &state->quarantines, live);
  }
  if (record.has_reservation()) {
    return ApplyReservation(record.reservation(), &state->reservations, live);
  }
  KREG_ASSIGN_OR_RETURN(TargetKey key, KeyOf(record));
  const uint64_t before = BytesOf(state->entries, key);
  KREG_RETURN_IF_ERROR(
      record.has_retirement()
          ? ApplyRetirement(record.retirement(), &state->entries)
      : record.has_generation()
          ? ApplyGenerations(record.generation(), &state->entries)
          : AddEntry(record.target(), &state->entries));
  *live = *live - before + BytesOf(state->entries, key);
  return absl::OkStatus();
}

// `record` (a registration) as a delta of the entry it replaces in
// `entries`, when it replaces one: only the generations that are new or
// changed, and the numbers of those kept.
void AsDelta(const std::vector<TargetEntry>& entries,
             v1::JournalRecord* record) {
  const TargetEntry* before = nullptr;
  absl::StatusOr<Platform> platform =
      ParsePlatform(record->target().platform());
  if (!platform.ok()) return;
  const TargetKey key{record->target().target_name(), *platform};
  const uint32_t generation =
      std::max<uint32_t>(record->target().generation(), 1);
  for (const TargetEntry& e : entries) {
    if (e.key == key && e.generation < generation) {
      before = &e;
      break;
    }
  }
  if (before == nullptr) return;
  std::map<uint32_t, std::string> had;
  const v1::Target had_target = ToProto(*before);
  for (const v1::Generation& g : had_target.generations()) {
    had[g.generation()] = g.SerializeAsString();
  }
  v1::GenerationRecord delta;
  *delta.mutable_target() = record->target();
  delta.mutable_target()->clear_generations();
  for (const v1::Generation& g : record->target().generations()) {
    auto it = had.find(g.generation());
    if (it != had.end() && it->second == g.SerializeAsString()) {
      delta.add_kept(g.generation());
    } else {
      *delta.mutable_target()->add_generations() = g;
    }
  }
  record->Clear();
  *record->mutable_generation() = std::move(delta);
}

}  // namespace

absl::Status ApplyRecord(const v1::JournalRecord& record, JournalState* state,
                         uint64_t* live) {
  return Apply(record, state, live);
}
void ToDelta(const std::vector<TargetEntry>& entries,
             v1::JournalRecord* record) {
  AsDelta(entries, record);
}

}  // namespace kreg
