#include "daemon/supervisor/crash_ledger.h"

namespace kreg {

void CrashLedger::Restore(const CrashRecord& r) {
  absl::MutexLock lock(&mu_);
  Row& row = rows_[KeyOf(r.key, r.uid)];
  row.record = r;
  row.record.quarantined = true;
  row.times.clear();
}

CrashRecord CrashLedger::Record(const TargetKey& key, uid_t uid,
                                const std::string& reason, int64_t now_s) {
  CrashRecord out;
  bool became_quarantined = false;
  {
    absl::MutexLock lock(&mu_);
    Row& row = rows_[KeyOf(key, uid)];
    const bool was = row.record.quarantined;
    row.record.key = key;
    row.record.uid = uid;
    row.record.crashes_total++;
    row.record.last_reason = reason;
    row.record.last_crash_unix_s = now_s;
    row.times.push_back(now_s);
    while (!row.times.empty() &&
           row.times.front() <= now_s - policy_.window_s) {
      row.times.pop_front();
    }
    row.record.crashes_in_window = static_cast<int>(row.times.size());
    if (policy_.max_crashes > 0 &&
        row.record.crashes_in_window >= policy_.max_crashes) {
      row.record.quarantined = true;
    }
    out = row.record;
    became_quarantined = !was && out.quarantined;
  }
  if (became_quarantined && sink_) sink_(out, true);
  return out;
}

std::optional<CrashRecord> CrashLedger::Quarantined(const TargetKey& key,
                                                    uid_t uid) const {
  absl::MutexLock lock(&mu_);
  auto it = rows_.find(KeyOf(key, uid));
  if (it == rows_.end() || !it->second.record.quarantined) return std::nullopt;
  return it->second.record;
}

std::vector<CrashRecord> CrashLedger::Unquarantine(
    const std::string& name, std::optional<Platform> platform,
    std::optional<uid_t> uid) {
  std::vector<CrashRecord> lifted;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [k, row] : rows_) {
      if (std::get<0>(k) != name) continue;
      if (platform && row.record.key.platform != *platform) continue;
      if (uid && row.record.uid != *uid) continue;
      if (row.record.quarantined) lifted.push_back(row.record);
      row.record.quarantined = false;
      row.record.crashes_in_window = 0;
      row.times.clear();
    }
  }
  if (sink_) {
    for (const CrashRecord& r : lifted) sink_(r, false);
  }
  return lifted;
}

std::vector<CrashRecord> CrashLedger::Rows(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  std::vector<CrashRecord> out;
  for (const auto& [k, row] : rows_) {
    if (name.empty() || std::get<0>(k) == name) out.push_back(row.record);
  }
  return out;
}

}  // namespace kreg
