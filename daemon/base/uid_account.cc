#include "daemon/base/uid_account.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kreg {

const UidResourceInfo& InfoOf(UidResource r) {
  static const UidResourceInfo kInfo[] = {
      {"gRPC connections", "max_grpc_connections_per_uid", "",
       "grpc_connections"},
      {"gRPC calls in flight", "max_grpc_calls_per_uid", "", "grpc_calls"},
      {"sessions", "max_sessions_per_uid", "", "sessions"},
      {"control connections", "max_control_connections_per_uid", "",
       "control_connections"},
      {"bytes of module uploads in flight", "max_upload_bytes_per_uid",
       " bytes", "upload_bytes"},
      {"registrations being hashed and probed", "max_heavy_work_per_uid", "",
       "heavy_work"},
      {"connections waiting for their first request",
       "max_pending_connections_per_uid", "", "pending_connections"},
      {"watch connections", "max_watch_connections_per_uid", "",
       "watch_connections"},
      {"handler states (instantiated call sites of handler bundles)",
       "max_states_per_uid", "", "states"},
  };
  static_assert(sizeof(kInfo) / sizeof(kInfo[0]) ==
                static_cast<size_t>(UidResource::kCount));
  return kInfo[static_cast<size_t>(r)];
}

UidAccount::Charge::Charge(Charge&& o) noexcept
    : account_(o.account_),
      uid_(o.uid_),
      resource_(o.resource_),
      amount_(o.amount_) {
  o.account_ = nullptr;
  o.amount_ = 0;
}

UidAccount::Charge& UidAccount::Charge::operator=(Charge&& o) noexcept {
  if (this != &o) {
    Release();
    account_ = o.account_;
    uid_ = o.uid_;
    resource_ = o.resource_;
    amount_ = o.amount_;
    o.account_ = nullptr;
    o.amount_ = 0;
  }
  return *this;
}

void UidAccount::Charge::Release() {
  if (account_ != nullptr && amount_ != 0) {
    account_->Give(uid_, resource_, amount_);
  }
  account_ = nullptr;
  amount_ = 0;
}

bool UidAccount::Fits(uid_t uid, UidResource r, uint64_t amount) {
  const uint64_t limit = limits_[static_cast<size_t>(r)];
  if (limit == 0) return true;
  auto it = held_.find({uid, static_cast<int>(r)});
  const uint64_t held = it == held_.end() ? 0 : it->second;
  return held <= limit && amount <= limit - held;
}

absl::Status UidAccount::Refusal(uid_t uid, UidResource r, uint64_t amount) {
  const UidResourceInfo& info = InfoOf(r);
  auto it = held_.find({uid, static_cast<int>(r)});
  const uint64_t held = it == held_.end() ? 0 : it->second;
  return absl::ResourceExhaustedError(absl::StrCat(
      "uid ", uid, " holds ", held, " ", info.what, " already; ", amount,
      info.unit, " more would exceed its limit of ",
      limits_[static_cast<size_t>(r)], info.unit, " (", info.key,
      "): wait for its other requests to end or close some, or ask the "
      "operator to raise ",
      info.key));
}

absl::StatusOr<UidAccount::Charge> UidAccount::Take(uid_t uid, UidResource r,
                                                    uint64_t amount) {
  absl::MutexLock lock(&mu_);
  if (!Fits(uid, r, amount)) return Refusal(uid, r, amount);
  if (amount != 0) held_[{uid, static_cast<int>(r)}] += amount;
  return Charge(this, uid, r, amount);
}

UidAccount::Charge UidAccount::Keep(uid_t uid, UidResource r, uint64_t amount) {
  absl::MutexLock lock(&mu_);
  if (amount != 0) held_[{uid, static_cast<int>(r)}] += amount;
  return Charge(this, uid, r, amount);
}

absl::StatusOr<UidAccount::Charge> UidAccount::TakeWithin(uid_t uid,
                                                          UidResource r,
                                                          uint64_t amount,
                                                          absl::Time deadline) {
  Want want{this, uid, r, amount};
  absl::MutexLock lock(&mu_);
  // A uid's own charges can make room only for an amount within its limit.
  if (amount <= limits_[static_cast<size_t>(r)]) {
    mu_.AwaitWithDeadline(absl::Condition(&WantFits, &want), deadline);
  }
  if (!Fits(uid, r, amount)) return Refusal(uid, r, amount);
  if (amount != 0) held_[{uid, static_cast<int>(r)}] += amount;
  return Charge(this, uid, r, amount);
}

bool UidAccount::WantFits(Want* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  return w->account->Fits(w->uid, w->r, w->amount);  // under mu_ (Await)
}

uint64_t UidAccount::Held(uid_t uid, UidResource r) {
  absl::MutexLock lock(&mu_);
  auto it = held_.find({uid, static_cast<int>(r)});
  return it == held_.end() ? 0 : it->second;
}

std::vector<UidAccount::Holding> UidAccount::Snapshot() {
  absl::MutexLock lock(&mu_);
  std::vector<Holding> out;
  out.reserve(held_.size());
  for (const auto& [key, held] : held_) {
    out.push_back({key.first, static_cast<UidResource>(key.second), held});
  }
  return out;
}

void UidAccount::Give(uid_t uid, UidResource r, uint64_t amount) {
  absl::MutexLock lock(&mu_);
  auto it = held_.find({uid, static_cast<int>(r)});
  if (it == held_.end()) return;
  it->second -= std::min(it->second, amount);
  if (it->second == 0) held_.erase(it);
}

}  // namespace kreg
