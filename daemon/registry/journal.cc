#include "daemon/registry/journal.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/base/files.h"
#include "daemon/base/validate.h"
#include "daemon/registry/target_proto.h"
#include "kreg/v1/journal.pb.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

constexpr size_t kHeader = 8;
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

// A later generation of a key in effect (docs/replace.md) takes its place;
// any other record is added (Registry::Restore refuses a second record of
// a key with other content, as a live registration would be).
absl::Status AddEntry(const v1::Target& target,
                      std::vector<TargetEntry>* entries) {
  absl::StatusOr<TargetEntry> entry = FromProto(target);
  if (!entry.ok()) return entry.status();
  for (TargetEntry& e : *entries) {
    if (e.key == entry->key && e.generation < entry->generation) {
      e = *std::move(entry);
      return absl::OkStatus();
    }
  }
  entries->push_back(*std::move(entry));
  return absl::OkStatus();
}

// Drops the registrations of the retired key recorded before it.
absl::Status ApplyRetirement(const v1::RetirementRecord& r,
                             std::vector<TargetEntry>* entries) {
  absl::StatusOr<Platform> platform = ParsePlatform(r.platform());
  if (!platform.ok()) return platform.status();
  const TargetKey key{r.target_name(), *platform};
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
                             std::vector<CrashRecord>* in_effect) {
  absl::Status st = ValidateTargetName(r.target_name());
  if (!st.ok()) return st;
  absl::StatusOr<Platform> platform = ParsePlatform(r.platform());
  if (!platform.ok()) return platform.status();
  CrashRecord e;
  e.key = {r.target_name(), *platform};
  e.uid = r.uid();
  e.quarantined = r.quarantined();
  e.crashes_in_window =
      static_cast<int>(std::min<uint32_t>(r.crashes_in_window(), 1u << 30));
  e.crashes_total = r.crashes_total();
  e.last_reason = r.last_reason();
  e.last_crash_unix_s = r.last_crash_unix_s();
  in_effect->erase(std::remove_if(in_effect->begin(), in_effect->end(),
                                  [&](const CrashRecord& q) {
                                    return q.key == e.key && q.uid == e.uid;
                                  }),
                   in_effect->end());
  if (e.quarantined) in_effect->push_back(std::move(e));
  return absl::OkStatus();
}

// The last record of a pattern decides.
absl::Status ApplyReservation(const v1::ReservationRecord& r,
                              std::vector<NameReservation>* in_effect) {
  in_effect->erase(std::remove_if(in_effect->begin(), in_effect->end(),
                                  [&](const NameReservation& e) {
                                    return e.pattern == r.pattern();
                                  }),
                   in_effect->end());
  if (r.lifted()) return absl::OkStatus();
  NameReservation e;
  e.pattern = r.pattern();
  e.group = r.group();
  e.owner = r.owner();
  e.by = PeerCred{r.uid(), r.gid(), r.pid()};
  e.at_us = r.at_us();
  in_effect->push_back(std::move(e));
  return absl::OkStatus();
}

}  // namespace

Journal::Journal(std::string path) : path_(std::move(path)) {}

absl::StatusOr<std::vector<TargetEntry>> Journal::Open() {
  absl::StatusOr<std::string> read = ReadFile(path_, SIZE_MAX);
  if (!read.ok() && !absl::IsNotFound(read.status())) return read.status();
  const std::string data = read.ok() ? *std::move(read) : "";
  std::vector<TargetEntry> entries;
  std::vector<CrashRecord> quarantines;
  std::vector<NameReservation> reservations;
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
    absl::Status st =
        record.has_retirement() ? ApplyRetirement(record.retirement(), &entries)
        : record.has_quarantine()
            ? ApplyQuarantine(record.quarantine(), &quarantines)
        : record.has_reservation()
            ? ApplyReservation(record.reservation(), &reservations)
            : AddEntry(record.target(), &entries);
    if (!st.ok()) {
      return absl::DataLossError(absl::StrCat(
          "journal ", path_, " record at byte ", pos, ": ", st.message()));
    }
    pos += kHeader + len;
  }
  quarantines_ = std::move(quarantines);
  reservations_ = std::move(reservations);
  absl::MutexLock lock(&mu_);
  fd_.reset(::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
  if (!fd_.ok()) {
    return ErrnoError("cannot open journal", path_);
  }
  if (::ftruncate(fd_.get(), static_cast<off_t>(pos)) != 0 ||
      ::lseek(fd_.get(), 0, SEEK_END) < 0 || ::fsync(fd_.get()) != 0) {
    return ErrnoError("cannot prepare journal", path_);
  }
  return entries;
}

absl::Status Journal::Append(const TargetEntry& entry) {
  v1::JournalRecord record;
  *record.mutable_target() = ToProto(entry);
  return AppendRecord(record.SerializeAsString());
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
  return AppendRecord(record.SerializeAsString());
}

absl::Status Journal::AppendQuarantine(const CrashRecord& e) {
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
  return AppendRecord(record.SerializeAsString());
}

absl::Status Journal::AppendReservation(const NameReservation& r, bool lifted) {
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
  return AppendRecord(record.SerializeAsString());
}

absl::Status Journal::AppendRecord(const std::string& payload) {
  std::string buf(kHeader, '\0');
  uint32_t len = static_cast<uint32_t>(payload.size());
  uint32_t crc = Crc(payload.data(), payload.size());
  std::memcpy(buf.data(), &len, 4);
  std::memcpy(buf.data() + 4, &crc, 4);
  buf += payload;
  absl::MutexLock lock(&mu_);
  if (!fd_.ok()) {
    return absl::FailedPreconditionError("journal is not open");
  }
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
  return absl::OkStatus();
}

}  // namespace kreg
