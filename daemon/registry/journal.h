// Append-only, fsynced log of accepted registrations (<state>/journal),
// compacted when it holds more dead records than live state.
#ifndef KREGD_DAEMON_REGISTRY_JOURNAL_H_
#define KREGD_DAEMON_REGISTRY_JOURNAL_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"
#include "daemon/registry/journal_state.h"
#include "daemon/registry/registration_service.h"

namespace kreg {

struct JournalOptions {
  // The journal is rewritten with its live records only (Compact) once the
  // bytes of superseded records pass both this and the live bytes: the file
  // stays below twice its live state plus this (docs/operator-guide.md,
  // "State, backup, upgrades").
  uint64_t compact_min_dead_bytes = 32u << 10;
};

// Record format: u32 little-endian payload length, u32 CRC-32 of the
// payload, payload (a serialized kreg.v1.JournalRecord). A replacement is
// journaled as a delta of the key's record before it (GenerationRecord:
// the new generation and the numbers of the earlier ones kept), so a record
// never repeats every generation. Thread-safe.
class Journal : public RegistrationLog {
 public:
  explicit Journal(std::string path, JournalOptions options = {});
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  // Reads every record and opens the file for appending; returns the
  // registrations in effect, in journal order (a retirement drops the
  // earlier registrations of its key). A torn last record (cut short, or a
  // bad checksum on the final record) is a crash during an unacknowledged
  // append: it is logged and truncated away. A bad record followed by
  // others is DATA_LOSS: the daemon must not guess. Compacts the file when
  // its dead bytes pass the threshold.
  absl::StatusOr<std::vector<TargetEntry>> Open();

  // Append one record and fdatasync it; then compact when the dead bytes
  // passed the threshold (a failed compaction is logged; the appended
  // record stays). FAILED_PRECONDITION before Open. An entry whose key is
  // in effect at a lower generation is written as a GenerationRecord.
  absl::Status Append(const TargetEntry& entry) override;
  absl::Status AppendRetirement(const Retirement& retirement) override;
  absl::Status AppendQuarantine(const CrashRecord& event);
  absl::Status AppendReservation(const NameReservation& reservation,
                                 bool lifted) override;

  // Rewrites the journal with one record per registration, quarantine and
  // reservation in effect (temp file, fsync, rename, directory fsync), so
  // that a crash leaves the old or the new file. FAILED_PRECONDITION before
  // Open; INTERNAL on I/O failure (the old file stays in use).
  absl::Status Compact();

  // After Open: the quarantines in effect (the last record of each target
  // and uid, when it quarantined), in journal order.
  const std::vector<CrashRecord>& quarantines() const { return quarantines_; }

  // After Open: the name reservations in effect, in journal order.
  const std::vector<NameReservation>& reservations() const {
    return reservations_;
  }

  // Number of bytes dropped by Open as a torn tail (0 if none).
  uint64_t torn_bytes() const { return torn_bytes_; }

  // The journal's size, the size Compact would write, and how many times it
  // compacted since Open (Open's own included).
  struct Sizes {
    uint64_t file_bytes = 0;
    uint64_t live_bytes = 0;
    uint64_t compactions = 0;
  };
  Sizes sizes() const;

  using State = JournalState;

 private:
  // Frames and appends `record` (a delta is computed here, under mu_) and
  // applies it to state_.
  absl::Status AppendRecord(v1::JournalRecord record);
  absl::Status CompactLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool CompactionDue() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const JournalOptions options_;
  mutable absl::Mutex mu_;
  UniqueFd fd_ ABSL_GUARDED_BY(mu_);
  State state_ ABSL_GUARDED_BY(mu_);
  uint64_t file_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t live_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t compactions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t torn_bytes_ = 0;
  std::vector<CrashRecord> quarantines_;       // set by Open
  std::vector<NameReservation> reservations_;  // set by Open
};

}  // namespace kreg

#endif  // KREGD_DAEMON_REGISTRY_JOURNAL_H_
