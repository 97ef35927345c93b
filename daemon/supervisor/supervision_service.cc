#include "daemon/supervisor/supervision_service.h"

#include <unistd.h>

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/base/validate.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

void Fill(const CrashRecord& r, v1::CrashRow* row) {
  row->set_target_name(r.key.name);
  row->set_platform(PlatformName(r.key.platform));
  row->set_uid(r.uid);
  row->set_crashes_total(r.crashes_total);
  row->set_crashes_in_window(static_cast<uint32_t>(r.crashes_in_window));
  row->set_quarantined(r.quarantined);
  row->set_last_reason(r.last_reason);
  row->set_last_crash_unix_s(r.last_crash_unix_s);
}

}  // namespace

SupervisionService::SupervisionService(CrashLedger* ledger, PeerOf peer_of)
    : ledger_(ledger), peer_of_(std::move(peer_of)) {}

grpc::Status SupervisionService::ListCrashes(grpc::ServerContext*,
                                             const v1::ListCrashesRequest* req,
                                             v1::ListCrashesResponse* resp) {
  for (const CrashRecord& r : ledger_->Rows(req->target_name())) {
    Fill(r, resp->add_rows());
  }
  resp->set_max_crashes(
      static_cast<uint32_t>(std::max(0, ledger_->policy().max_crashes)));
  resp->set_window_s(ledger_->policy().window_s);
  return grpc::Status::OK;
}

grpc::Status SupervisionService::Unquarantine(
    grpc::ServerContext* ctx, const v1::UnquarantineRequest* req,
    v1::UnquarantineResponse* resp) {
  if (absl::Status s = ValidateTargetName(req->target_name()); !s.ok()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        std::string(s.message()));
  }
  std::optional<Platform> platform;
  if (!req->platform().empty()) {
    absl::StatusOr<Platform> p = ParsePlatform(req->platform());
    if (!p.ok()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          std::string(p.status().message()));
    }
    platform = *p;
  }
  PeerCred peer = peer_of_(ctx->peer());
  const bool admin = peer.uid == 0 || peer.uid == ::geteuid();
  std::optional<uid_t> uid;
  if (req->has_uid()) uid = req->uid();
  if (!admin) {
    if (uid && *uid != peer.uid) {
      return grpc::Status(
          grpc::StatusCode::PERMISSION_DENIED,
          absl::StrCat("uid ", peer.uid,
                       " may lift only its own quarantine, "
                       "not uid ",
                       *uid, "'s; ask root or kregd's operator"));
    }
    uid = peer.uid;
  }
  std::vector<CrashRecord> lifted =
      ledger_->Unquarantine(req->target_name(), platform, uid);
  for (const CrashRecord& r : lifted) {
    Fill(r, resp->add_lifted());
    spdlog::info("uid {} (pid {}) lifted the quarantine of {} ({}) for uid {}",
                 peer.uid, peer.pid, r.key.name, PlatformName(r.key.platform),
                 r.uid);
  }
  if (lifted.empty()) {
    return grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrCat(
            "target \"", req->target_name(), "\"",
            platform ? absl::StrCat(" (", PlatformName(*platform), ")") : "",
            " is not quarantined", uid ? absl::StrCat(" for uid ", *uid) : "",
            "; `kregctl show ", req->target_name(), "` lists its crashes"));
  }
  return grpc::Status::OK;
}

}  // namespace kreg
