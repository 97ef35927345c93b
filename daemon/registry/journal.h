// Append-only, fsynced log of accepted registrations (<state>/journal).
#ifndef KREGD_DAEMON_REGISTRY_JOURNAL_H_
#define KREGD_DAEMON_REGISTRY_JOURNAL_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"
#include "daemon/registry/registry.h"

namespace kreg {

// Record format: u32 little-endian payload length, u32 CRC-32 of the
// payload, payload (a serialized kreg.v1.JournalRecord). Thread-safe.
class Journal : public RegistrationLog {
 public:
  explicit Journal(std::string path);
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  // Reads every record and opens the file for appending; returns the
  // registrations in effect, in journal order (a retirement drops the
  // earlier registrations of its key). A torn last record (cut short, or a
  // bad checksum on the final record) is a crash during an unacknowledged
  // append: it is logged and truncated away. A bad record followed by
  // others is DATA_LOSS: the daemon must not guess.
  absl::StatusOr<std::vector<TargetEntry>> Open();

  // Append one record and fdatasync it. FAILED_PRECONDITION before Open.
  absl::Status Append(const TargetEntry& entry) override;
  absl::Status AppendRetirement(const Retirement& retirement) override;
  absl::Status AppendQuarantine(const CrashRecord& event);
  absl::Status AppendReservation(const NameReservation& reservation,
                                 bool lifted) override;

  // After Open: the quarantines in effect (the last record of each target
  // and uid, when it quarantined), in journal order.
  const std::vector<CrashRecord>& quarantines() const { return quarantines_; }

  // After Open: the name reservations in effect, in journal order.
  const std::vector<NameReservation>& reservations() const {
    return reservations_;
  }

  // Number of bytes dropped by Open as a torn tail (0 if none).
  uint64_t torn_bytes() const { return torn_bytes_; }

 private:
  absl::Status AppendRecord(const std::string& payload);

  const std::string path_;
  absl::Mutex mu_;
  UniqueFd fd_ ABSL_GUARDED_BY(mu_);
  uint64_t torn_bytes_ = 0;
  std::vector<CrashRecord> quarantines_;       // set by Open
  std::vector<NameReservation> reservations_;  // set by Open
};

}  // namespace kreg

#endif  // KREGD_DAEMON_REGISTRY_JOURNAL_H_
