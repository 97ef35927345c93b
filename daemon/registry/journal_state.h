// The records of kregd's journal and the state they put in effect: what
// Journal replays, appends (a replacement as a delta) and compacts.
#ifndef KREGD_DAEMON_REGISTRY_JOURNAL_STATE_H_
#define KREGD_DAEMON_REGISTRY_JOURNAL_STATE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "daemon/base/types.h"
#include "kreg/v1/journal.pb.h"

namespace kreg {

// The frame before each record: u32 length, u32 CRC-32.
constexpr uint64_t kJournalHeaderBytes = 8;

// What the records replayed so far put in effect. A plain value.
struct JournalState {
  std::vector<TargetEntry> entries;  // journal order
  std::vector<CrashRecord> quarantines;
  std::vector<NameReservation> reservations;
};

// The record of one registration, quarantine or reservation (made, or
// `lifted`), as appended and as a compaction writes it.
v1::JournalRecord TargetRecordOf(const TargetEntry& e);
v1::JournalRecord QuarantineRecordOf(const CrashRecord& e);
v1::JournalRecord ReservationRecordOf(const NameReservation& r, bool lifted);

// Folds `record` into `state`, keeping `*live` (the framed bytes a
// compaction of `state` writes) current. A later generation of a key in
// effect takes its place; a retirement drops its key; the last quarantine
// of a (target, uid) and the last record of a reservation pattern decide.
// INVALID_ARGUMENT for a bad name or platform, DATA_LOSS for a delta that
// does not fit the record before it.
absl::Status ApplyRecord(const v1::JournalRecord& record, JournalState* state,
                         uint64_t* live);

// Rewrites `record` (a registration) as a GenerationRecord when it replaces
// an entry of `entries` (its key at a lower generation): only the
// generations that are new or changed, and the numbers of those kept.
void ToDelta(const std::vector<TargetEntry>& entries,
             v1::JournalRecord* record);

}  // namespace kreg

#endif  // KREGD_DAEMON_REGISTRY_JOURNAL_STATE_H_
