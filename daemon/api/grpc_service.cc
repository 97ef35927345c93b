#include "daemon/api/grpc_service.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/base/edit_distance.h"
#include "daemon/base/module_upload.h"
#include "daemon/base/validate.h"
#include "daemon/registry/registration_mapper.h"
#include "daemon/registry/target_proto.h"
#include "google/rpc/status.pb.h"

namespace kreg {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

grpc::Status RefusalToGrpcStatus(const absl::Status& status,
                                 const v1::KernelRegistrationError& error) {
  google::rpc::Status rpc;
  rpc.set_code(static_cast<int>(status.code()));
  rpc.set_message(std::string(status.message()));
  rpc.add_details()->PackFrom(error);
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()), rpc.SerializeAsString());
}

RegistryService::RegistryService(RegistryServiceParts parts)
    : parts_(std::move(parts)),
      registrar_(parts_.registrar),
      registry_(parts_.registry) {
  if (!parts_.cuda_status_of) {
    parts_.cuda_status_of = [] { return absl::OkStatus(); };
  }
}

grpc::Status RegistryService::RegisterTarget(
    grpc::ServerContext* ctx, grpc::ServerReader<v1::RegisterTargetChunk>* in,
    v1::RegisterTargetResponse* resp) {
  // The whole stream, header included, within grpc_stream_timeout_s.
  CallDeadlines::Watch watch =
      deadlines_.Cancel(ctx, absl::Now() + parts_.stream_timeout);
  // Read once, at the start: gRPC may give the fd number to another
  // connection once this one's peer has gone.
  const PeerCred peer = parts_.peer_of(ctx->peer());
  absl::StatusOr<UidAccount::Charge> call = ChargeCall(peer);
  if (!call.ok()) return ToGrpcStatus(call.status());
  v1::RegisterTargetChunk chunk;
  if (!in->Read(&chunk) || !chunk.has_header()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "RegisterTarget: the first message must carry the "
                        "header");
  }
  const v1::RegisterTargetHeader header = chunk.header();
  uint64_t announced = 0;  // module bytes the stream may carry
  UidAccount::Charge hold;
  if (header.module().source_case() == v1::ModuleSource::kUploadSize) {
    announced = header.module().upload_size();
    // Refused before the bytes are spent (quota, size, name, platform,
    // the uid's share of upload bytes in flight).
    absl::Status early = registrar_->PrecheckUpload(
        header.target_name(), header.platform(), announced, peer);
    if (!early.ok()) return ToGrpcStatus(early);
    absl::StatusOr<UidAccount::Charge> c =
        HoldUpload(parts_.account, peer.uid, announced);
    if (!c.ok()) return ToGrpcStatus(c.status());
    hold = *std::move(c);
  }
  std::string upload;
  for (size_t index = 1; in->Read(&chunk); ++index) {
    if (!chunk.has_module_bytes()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "RegisterTarget: only the first message may carry "
                          "a header");
    }
    absl::Status chunk_ok =
        ValidateUploadChunk(chunk.module_bytes().size(), index);
    if (!chunk_ok.ok()) return ToGrpcStatus(chunk_ok);
    if (upload.size() + chunk.module_bytes().size() > announced) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("RegisterTarget: the stream carries more than the ",
                       announced,
                       " module bytes its header announced "
                       "(module.upload_size); chunk ",
                       index, " brings it to ",
                       upload.size() + chunk.module_bytes().size(),
                       "; announce the module's exact size"));
    }
    upload += chunk.module_bytes();
  }
  if (ctx->IsCancelled()) {
    return grpc::Status(
        grpc::StatusCode::DEADLINE_EXCEEDED,
        absl::StrCat("RegisterTarget: the upload did not end within ",
                     absl::FormatDuration(parts_.stream_timeout),
                     " (grpc_stream_timeout_s) or was cancelled; ",
                     upload.size(), " of ", announced,
                     " module bytes had arrived"));
  }
  // Hashing and probing wait for the uid's own other such work.
  UidAccount::Charge heavy;
  if (parts_.account != nullptr) {
    absl::StatusOr<UidAccount::Charge> c =
        parts_.account->TakeWithin(peer.uid, UidResource::kHeavyWork, 1,
                                   absl::Now() + parts_.heavy_work_wait);
    if (!c.ok()) return ToGrpcStatus(c.status());
    heavy = *std::move(c);
  }
  absl::StatusOr<v1::RegisterTargetResponse> out = RegisterFromHeader(
      registrar_, header, std::move(upload), peer, parts_.cuda_status_of());
  if (out.status().code() == absl::StatusCode::kFailedPrecondition) {
    return RefusalToGrpcStatus(out.status(),
                               RefusalDetail(header, registry_->core()));
  }
  if (!out.ok()) return ToGrpcStatus(out.status());
  *resp = *std::move(out);
  return grpc::Status::OK;
}

absl::StatusOr<UidAccount::Charge> RegistryService::ChargeCall(
    const PeerCred& peer) {
  if (parts_.account == nullptr) return UidAccount::Charge();
  return parts_.account->Take(peer.uid, UidResource::kGrpcCalls, 1);
}

grpc::Status RegistryService::ListTargets(grpc::ServerContext*,
                                          const v1::ListTargetsRequest*,
                                          v1::ListTargetsResponse* resp) {
  *resp = DescribeTargets(registry_->core(), parts_.cuda_status_of());
  return grpc::Status::OK;
}

// " (registered for cuda only)" when the name has other platforms, else
// " (did you mean \"a\", \"b\"?)" for up to three registered names within a
// few edits of `name`, else "".
std::string RegistryService::CloseNames(const std::string& name) {
  std::set<std::string> platforms, close;
  for (const EntryPtr& e : registry_->List()) {
    if (e->key.name == name) {
      platforms.insert(std::string(PlatformName(e->key.platform)));
    } else if (EditDistance(e->key.name, name) <=
               std::max<size_t>(2, name.size() / 4)) {
      close.insert(e->key.name);
    }
  }
  if (!platforms.empty()) {
    return absl::StrCat(" (registered for ", absl::StrJoin(platforms, ", "),
                        " only)");
  }
  if (close.empty()) return "";
  std::vector<std::string> some(close.begin(), close.end());
  if (some.size() > 3) some.resize(3);
  return absl::StrCat(" (did you mean \"", absl::StrJoin(some, "\", \""),
                      "\"?)");
}

grpc::Status RegistryService::GetTarget(grpc::ServerContext*,
                                        const v1::GetTargetRequest* req,
                                        v1::GetTargetResponse* resp) {
  absl::Status st = ValidateTargetName(req->target_name());
  if (!st.ok()) return ToGrpcStatus(st);
  std::vector<EntryPtr> found;
  if (req->platform().empty()) {
    found = registry_->Find(req->target_name());
  } else {
    absl::StatusOr<Platform> platform = ParsePlatform(req->platform());
    if (!platform.ok()) return ToGrpcStatus(platform.status());
    if (EntryPtr e = registry_->Lookup({req->target_name(), *platform})) {
      found.push_back(e);
    }
  }
  if (found.empty()) {
    return grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrCat("no target \"", req->target_name(), "\"",
                     req->platform().empty()
                         ? ""
                         : absl::StrCat(" on platform ", req->platform()),
                     " is registered", CloseNames(req->target_name()),
                     "; `kregctl list` shows what is"));
  }
  for (const EntryPtr& e : found) {
    v1::Target* t = resp->add_targets();
    *t = DescribeTarget(*e, parts_.cuda_status_of());
    if (parts_.stats_of) parts_.stats_of(*e, t);
  }
  return grpc::Status::OK;
}

grpc::Status RegistryService::GetStatus(grpc::ServerContext*,
                                        const v1::GetStatusRequest*,
                                        v1::GetStatusResponse* resp) {
  parts_.status_of(resp);
  return grpc::Status::OK;
}

grpc::Status RegistryService::RetireTarget(grpc::ServerContext* ctx,
                                           const v1::RetireTargetRequest* req,
                                           v1::RetireTargetResponse* resp) {
  absl::Status st = ValidateTargetName(req->target_name());
  if (!st.ok()) return ToGrpcStatus(st);
  std::optional<Platform> platform;
  if (!req->platform().empty()) {
    absl::StatusOr<Platform> parsed = ParsePlatform(req->platform());
    if (!parsed.ok()) return ToGrpcStatus(parsed.status());
    platform = *parsed;
  }
  absl::StatusOr<std::vector<EntryPtr>> retired = registry_->Retire(
      req->target_name(), platform, parts_.peer_of(ctx->peer()));
  if (!retired.ok()) return ToGrpcStatus(retired.status());
  for (const EntryPtr& e : *retired) *resp->add_retired() = ToProto(*e);
  return grpc::Status::OK;
}

grpc::Status RegistryService::ReserveNames(grpc::ServerContext* ctx,
                                           const v1::ReserveNamesRequest* req,
                                           v1::ReserveNamesResponse* resp) {
  const PeerCred peer = parts_.peer_of(ctx->peer());
  absl::Status st;
  if (req->lift()) {
    st = registry_->Unreserve(req->pattern(), peer);
  } else if (!req->pattern().empty()) {
    absl::StatusOr<NameReservation> r =
        ParseReservation(req->pattern(), req->owner());
    st = r.ok() ? registry_->Reserve(*r, peer) : r.status();
  }
  if (!st.ok()) return ToGrpcStatus(st);
  for (const NameReservation& r : registry_->Reservations()) {
    v1::NameReservation* out = resp->add_reservations();
    out->set_pattern(r.pattern);
    out->set_owner(OwnerName(r));
    out->set_owner_id(r.owner);
    out->set_owner_is_group(r.group);
    out->set_reserved_by_uid(r.by.uid);
    out->set_reserved_at_us(r.at_us);
  }
  return grpc::Status::OK;
}

grpc::Status RegistryService::CollectGarbage(grpc::ServerContext* ctx,
                                             const v1::CollectGarbageRequest*,
                                             v1::CollectGarbageResponse* resp) {
  absl::StatusOr<GcOutcome> out =
      registry_->CollectGarbage(parts_.peer_of(ctx->peer()));
  if (!out.ok()) return ToGrpcStatus(out.status());
  resp->set_files_removed(out->files_removed);
  resp->set_bytes_removed(out->bytes_removed);
  resp->set_files_kept(out->files_kept);
  resp->set_bytes_kept(out->bytes_kept);
  if (parts_.compile != nullptr) {
    // The compile cache down to half its bound, least recently used first
    // (docs/operator-guide.md, "The compile service").
    CompileCacheTrim trim = parts_.compile->cache()->TrimTo(
        parts_.compile->cache()->max_bytes() / 2);
    resp->set_compile_files_removed(trim.removed.files);
    resp->set_compile_bytes_removed(trim.removed.bytes);
    resp->set_compile_files_kept(trim.kept.files);
    resp->set_compile_bytes_kept(trim.kept.bytes);
  }
  return grpc::Status::OK;
}

grpc::Status RegistryService::ListSessions(grpc::ServerContext*,
                                           const v1::ListSessionsRequest*,
                                           v1::ListSessionsResponse* resp) {
  if (parts_.sessions_of) parts_.sessions_of(resp);
  return grpc::Status::OK;
}

grpc::Status RegistryService::GetConfig(grpc::ServerContext*,
                                        const v1::GetConfigRequest*,
                                        v1::GetConfigResponse* resp) {
  if (parts_.config_of) parts_.config_of(resp);
  return grpc::Status::OK;
}

grpc::Status RegistryService::CompileTarget(
    grpc::ServerContext* ctx, const v1::CompileTargetRequest* req,
    grpc::ServerWriter<v1::CompileTargetEvent>* out) {
  if (parts_.compile == nullptr) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        "this kregd has no compile service");
  }
  absl::StatusOr<CompileOutcome> r = parts_.compile->Compile(
      *req, parts_.peer_of(ctx->peer()),
      [out](const std::string& diagnostics) {
        v1::CompileTargetEvent e;
        e.set_diagnostics(diagnostics);
        out->Write(e);
      },
      [ctx] { return ctx->IsCancelled(); });
  if (!r.ok()) {
    // Which step failed, for clients that raise a different error for a
    // compile error than for a registration refusal (kreg.CompileError).
    if (absl::optional<absl::Cord> stage =
            r.status().GetPayload(kCompileStagePayload)) {
      ctx->AddTrailingMetadata("kreg-compile-stage", std::string(*stage));
    }
    return ToGrpcStatus(r.status());
  }
  v1::CompileTargetEvent e;
  v1::CompileTargetResult* result = e.mutable_result();
  result->set_created(r->registration.created);
  *result->mutable_target() =
      DescribeTarget(*r->registration.entry, parts_.cuda_status_of());
  result->set_cache_key(r->cache_key);
  result->set_cache_hit(r->cache_hit);
  result->set_waited(r->waited);
  out->Write(e);
  return grpc::Status::OK;
}

}  // namespace kreg
