#include "daemon/registry/journal.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "daemon/base/files.h"
#include "daemon/registry/journal_state.h"
#include "kreg/v1/journal.pb.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

constexpr size_t kHeader = kJournalHeaderBytes;
constexpr uint32_t kMaxRecord = 1 << 20;

uint32_t Crc(const char* data, size_t n) {
  return static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(data), static_cast<uInt>(n)));
}

uint32_t LoadU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

std::string Frame(const v1::JournalRecord& record) {
  const std::string payload = record.SerializeAsString();
  std::string buf(kHeader, '\0');
  uint32_t len = static_cast<uint32_t>(payload.size());
  uint32_t crc = Crc(payload.data(), payload.size());
  std::memcpy(buf.data(), &len, 4);
  std::memcpy(buf.data() + 4, &crc, 4);
  return buf + payload;
}

}  // namespace

Journal::Journal(std::string path, JournalOptions options)
    : path_(std::move(path)), options_(options) {}

absl::StatusOr<std::vector<TargetEntry>> Journal::Open() {
  absl::StatusOr<std::string> read = ReadFile(path_, SIZE_MAX);
  if (!read.ok() && !absl::IsNotFound(read.status())) return read.status();
  const std::string data = read.ok() ? *std::move(read) : "";
  JournalState state;
  uint64_t live = 0;
  size_t pos = 0;
  while (pos < data.size()) {
    size_t left = data.size() - pos;
    uint32_t len = left >= kHeader ? LoadU32(data.data() + pos) : 0;
    bool complete =
        left >= kHeader && len <= kMaxRecord && len <= left - kHeader;
    bool intact = complete && LoadU32(data.data() + pos + 4) ==
                                  Crc(data.data() + pos + kHeader, len);
    v1::JournalRecord record;
    if (intact) {
      intact = record.ParseFromArray(data.data() + pos + kHeader,
                                     static_cast<int>(len));
    }
    bool last = !complete || pos + kHeader + len == data.size();
    if (!intact && !last) {
      return absl::DataLossError(absl::StrCat(
          "journal ", path_, " has a corrupt record at byte ", pos,
          " followed by more records; refusing to guess which registrations "
          "are valid. Restore the journal from a backup."));
    }
    if (!intact) {
      torn_bytes_ = left;
      spdlog::warn("journal {}: ignoring a torn last record ({} bytes at {})",
                   path_, left, pos);
      break;
    }
    if (absl::Status st = ApplyRecord(record, &state, &live); !st.ok()) {
      return absl::DataLossError(absl::StrCat(
          "journal ", path_, " record at byte ", pos, ": ", st.message()));
    }
    pos += kHeader + len;
  }
  quarantines_ = state.quarantines;
  reservations_ = state.reservations;
  absl::MutexLock lock(&mu_);
  fd_.reset(::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
  if (!fd_.ok()) {
    return ErrnoError("cannot open journal", path_);
  }
  if (::ftruncate(fd_.get(), static_cast<off_t>(pos)) != 0 ||
      ::lseek(fd_.get(), 0, SEEK_END) < 0 || ::fsync(fd_.get()) != 0) {
    return ErrnoError("cannot prepare journal", path_);
  }
  state_ = std::move(state);
  file_bytes_ = pos;
  live_bytes_ = live;
  compactions_ = 0;
  if (CompactionDue()) {
    if (absl::Status st = CompactLocked(); !st.ok()) {
      spdlog::warn("journal {}: not compacted at start: {}", path_,
                   std::string(st.message()));
    }
  }
  return state_.entries;
}

absl::Status Journal::Append(const TargetEntry& entry) {
  return AppendRecord(TargetRecordOf(entry));
}

absl::Status Journal::AppendRetirement(const Retirement& r) {
  v1::JournalRecord record;
  v1::RetirementRecord* p = record.mutable_retirement();
  p->set_target_name(r.key.name);
  p->set_platform(PlatformName(r.key.platform));
  p->set_content_id(r.content_id);
  p->set_module_digest(r.module_digest);
  p->set_uid(r.retired_by.uid);
  p->set_gid(r.retired_by.gid);
  p->set_pid(r.retired_by.pid);
  p->set_retired_at_us(r.retired_at_us);
  return AppendRecord(std::move(record));
}

absl::Status Journal::AppendQuarantine(const CrashRecord& e) {
  return AppendRecord(QuarantineRecordOf(e));
}

absl::Status Journal::AppendReservation(const NameReservation& r, bool lifted) {
  return AppendRecord(ReservationRecordOf(r, lifted));
}

absl::Status Journal::AppendRecord(v1::JournalRecord record) {
  absl::MutexLock lock(&mu_);
  if (!fd_.ok()) {
    return absl::FailedPreconditionError("journal is not open");
  }
  if (record.has_target()) ToDelta(state_.entries, &record);
  const std::string buf = Frame(record);
  off_t start = ::lseek(fd_.get(), 0, SEEK_END);
  if (absl::Status st = WriteAll(fd_.get(), buf, "journal " + path_);
      !st.ok()) {
    // Cut a partial record so the next append does not follow garbage.
    if (start >= 0 && ::ftruncate(fd_.get(), start) == 0) {
      ::lseek(fd_.get(), start, SEEK_SET);
    }
    return st;
  }
  if (::fdatasync(fd_.get()) != 0) {
    return ErrnoError("cannot fsync journal", path_);
  }
  file_bytes_ += buf.size();
  if (absl::Status st = ApplyRecord(record, &state_, &live_bytes_); !st.ok()) {
    // The record is durable; Open replays it the same way and says so.
    spdlog::error("journal {}: a record appended at byte {} does not apply: {}",
                  path_, start, std::string(st.message()));
    return absl::OkStatus();
  }
  if (CompactionDue()) {
    if (absl::Status st = CompactLocked(); !st.ok()) {
      spdlog::warn("journal {}: not compacted: {}", path_,
                   std::string(st.message()));
    }
  }
  return absl::OkStatus();
}

bool Journal::CompactionDue() const {
  const uint64_t dead =
      file_bytes_ > live_bytes_ ? file_bytes_ - live_bytes_ : 0;
  return dead > options_.compact_min_dead_bytes && dead > live_bytes_;
}

absl::Status Journal::Compact() {
  absl::MutexLock lock(&mu_);
  if (!fd_.ok()) return absl::FailedPreconditionError("journal is not open");
  return CompactLocked();
}

absl::Status Journal::CompactLocked() {
  std::string buf;
  for (const TargetEntry& e : state_.entries) buf += Frame(TargetRecordOf(e));
  for (const CrashRecord& q : state_.quarantines) {
    buf += Frame(QuarantineRecordOf(q));
  }
  for (const NameReservation& r : state_.reservations) {
    buf += Frame(ReservationRecordOf(r, false));
  }
  const size_t slash = path_.rfind('/');
  KREG_ASSIGN_OR_RETURN(
      std::string temp,
      WriteTempFile(DirOf(path_),
                    path_.substr(slash == std::string::npos ? 0 : slash + 1),
                    buf, 0600));
  // Opened before the rename: appends go on in the file that replaces the
  // journal, and a failure leaves the old one in use.
  UniqueFd fd(::open(temp.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd.ok() || ::lseek(fd.get(), 0, SEEK_END) < 0) {
    absl::Status st = ErrnoError("cannot open compacted journal", temp);
    ::unlink(temp.c_str());
    return st;
  }
  KREG_RETURN_IF_ERROR(CommitTempFile(temp, path_));
  spdlog::info("journal {}: compacted {} bytes to {} ({} live records)", path_,
               file_bytes_, buf.size(),
               state_.entries.size() + state_.quarantines.size() +
                   state_.reservations.size());
  fd_ = std::move(fd);
  file_bytes_ = buf.size();
  live_bytes_ = buf.size();
  ++compactions_;
  return absl::OkStatus();
}

Journal::Sizes Journal::sizes() const {
  absl::MutexLock lock(&mu_);
  return {file_bytes_, live_bytes_, compactions_};
}

}  // namespace kreg
