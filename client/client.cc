#include "client/client.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/paths.h"
#include "common/status_macros.h"
#include "google/rpc/status.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace kreg {
namespace {

constexpr size_t kChunk = 1 << 20;

std::unique_ptr<grpc::ClientContext> Context() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::seconds(120));
  return ctx;
}

}  // namespace

Client::Client(const std::string& socket_path)
    : socket_path_(socket_path),
      channel_(grpc::CreateChannel("unix:" + socket_path,
                                   grpc::InsecureChannelCredentials())),
      stub_(v1::Registry::NewStub(channel_)) {}

Client::Client(std::shared_ptr<grpc::Channel> channel, const std::string& name)
    : socket_path_(name),
      channel_(std::move(channel)),
      stub_(v1::Registry::NewStub(channel_)) {}

absl::Status Client::FromGrpc(const grpc::Status& s) const {
  if (s.ok()) return absl::OkStatus();
  // kregd's own UNAVAILABLE (cluster mode: etcd unreachable) says so; any
  // other is the transport's: kregd itself is not there.
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE &&
      s.error_message().find("the cluster registry") == std::string::npos) {
    if (std::string why = SocketPermissionProblem(socket_path_); !why.empty()) {
      return absl::PermissionDeniedError(why);
    }
    return absl::UnavailableError(absl::StrCat(
        "cannot reach kregd at ", socket_path_, " (", s.error_message(),
        "); is it running? Start it with `kregd --socket ", socket_path_,
        "` or `systemctl start kregd`"));
  }
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

absl::StatusOr<v1::RegisterTargetResponse> Client::Register(
    const RegisterRequest& req, RegisterError* error) {
  v1::RegisterTargetChunk header;
  v1::RegisterTargetHeader* h = header.mutable_header();
  h->set_target_name(req.target_name);
  h->set_func_name(req.func_name);
  for (const auto& [stage, symbol] : req.stages) {
    v1::StageFunction* f = h->add_stages();
    f->set_stage(stage);
    f->set_symbol(symbol);
  }
  if (!req.state_type_name.empty() || !req.state_type_id_symbol.empty() ||
      !req.state_type_info_symbol.empty()) {
    h->mutable_state_type()->set_name(req.state_type_name);
    h->mutable_state_type()->set_type_id_symbol(req.state_type_id_symbol);
    h->mutable_state_type()->set_type_info_symbol(req.state_type_info_symbol);
  }
  h->set_platform(req.platform);
  h->set_content_id(req.content_id);
  h->set_replace(req.replace);
  h->set_in_process(req.in_process);
  if (req.in_process) {
    // No module: the callable runs in the registering process.
  } else if (!req.daemon_path.empty()) {
    h->mutable_module()->set_path(req.daemon_path);
  } else {
    h->mutable_module()->set_upload_size(req.module_bytes.size());
    h->mutable_module()->set_file_name(req.module_file_name);
  }
  auto ctx = Context();
  v1::RegisterTargetResponse resp;
  std::unique_ptr<grpc::ClientWriter<v1::RegisterTargetChunk>> writer(
      stub_->RegisterTarget(ctx.get(), &resp));
  bool open = writer->Write(header);
  for (size_t pos = 0;
       open && req.daemon_path.empty() && pos < req.module_bytes.size();
       pos += kChunk) {
    v1::RegisterTargetChunk chunk;
    chunk.set_module_bytes(req.module_bytes.substr(pos, kChunk));
    open = writer->Write(chunk);
    if (req.progress) {
      req.progress(std::min<uint64_t>(pos + kChunk, req.module_bytes.size()),
                   req.module_bytes.size());
    }
  }
  writer->WritesDone();
  grpc::Status s = writer->Finish();
  if (!s.ok()) {
    absl::Status st = FromGrpc(s);
    if (error != nullptr) {
      *error = RegisterError{st};
      google::rpc::Status rpc;
      if (!s.error_details().empty() &&
          rpc.ParseFromString(s.error_details())) {
        for (const auto& any : rpc.details()) {
          error->has_detail = error->has_detail || any.UnpackTo(&error->detail);
        }
      }
    }
    return st;
  }
  return resp;
}

template <typename Stub, typename Req, typename Resp>
absl::StatusOr<Resp> Client::Unary(
    grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&, Resp*),
    Stub& stub, const Req& req) {
  auto ctx = Context();
  Resp resp;
  grpc::Status s = (stub.*method)(ctx.get(), req, &resp);
  if (!s.ok()) return FromGrpc(s);
  return resp;
}

absl::StatusOr<std::vector<v1::Target>> Client::List() {
  KREG_ASSIGN_OR_RETURN(auto resp, Unary(&v1::Registry::Stub::ListTargets,
                                         *stub_, v1::ListTargetsRequest()));
  return std::vector<v1::Target>(resp.targets().begin(), resp.targets().end());
}

absl::StatusOr<std::vector<v1::Target>> Client::Get(
    const std::string& name, const std::string& platform) {
  v1::GetTargetRequest req;
  req.set_target_name(name);
  req.set_platform(platform);
  KREG_ASSIGN_OR_RETURN(auto resp,
                        Unary(&v1::Registry::Stub::GetTarget, *stub_, req));
  return std::vector<v1::Target>(resp.targets().begin(), resp.targets().end());
}

absl::StatusOr<v1::GetStatusResponse> Client::Status() {
  return Unary(&v1::Registry::Stub::GetStatus, *stub_, v1::GetStatusRequest());
}

absl::StatusOr<v1::GetConfigResponse> Client::Config() {
  return Unary(&v1::Registry::Stub::GetConfig, *stub_, v1::GetConfigRequest());
}

absl::StatusOr<v1::ListSessionsResponse> Client::Sessions() {
  return Unary(&v1::Registry::Stub::ListSessions, *stub_,
               v1::ListSessionsRequest());
}

absl::StatusOr<v1::ListCrashesResponse> Client::Crashes(
    const std::string& name) {
  v1::ListCrashesRequest req;
  req.set_target_name(name);
  return Unary(&v1::Supervision::Stub::ListCrashes,
               *v1::Supervision::NewStub(channel_), req);
}

absl::StatusOr<v1::ListClusterTargetsResponse> Client::ClusterTargets() {
  return Unary(&v1::Cluster::Stub::ListTargets, *v1::Cluster::NewStub(channel_),
               v1::ListClusterTargetsRequest());
}

absl::StatusOr<v1::ListHostsResponse> Client::Hosts() {
  return Unary(&v1::Cluster::Stub::ListHosts, *v1::Cluster::NewStub(channel_),
               v1::ListHostsRequest());
}

absl::StatusOr<v1::UnquarantineResponse> Client::Unquarantine(
    const v1::UnquarantineRequest& req) {
  return Unary(&v1::Supervision::Stub::Unquarantine,
               *v1::Supervision::NewStub(channel_), req);
}

absl::StatusOr<std::vector<v1::Target>> Client::Retire(
    const std::string& name, const std::string& platform) {
  v1::RetireTargetRequest req;
  req.set_target_name(name);
  req.set_platform(platform);
  KREG_ASSIGN_OR_RETURN(auto resp,
                        Unary(&v1::Registry::Stub::RetireTarget, *stub_, req));
  return std::vector<v1::Target>(resp.retired().begin(), resp.retired().end());
}

absl::StatusOr<v1::ReserveNamesResponse> Client::ReserveNames(
    const v1::ReserveNamesRequest& req) {
  return Unary(&v1::Registry::Stub::ReserveNames, *stub_, req);
}

absl::StatusOr<v1::CollectGarbageResponse> Client::CollectGarbage() {
  return Unary(&v1::Registry::Stub::CollectGarbage, *stub_,
               v1::CollectGarbageRequest());
}

absl::Status Client::Health() {
  using grpc::health::v1::HealthCheckResponse;
  KREG_ASSIGN_OR_RETURN(auto resp,
                        Unary(&grpc::health::v1::Health::Stub::Check,
                              *grpc::health::v1::Health::NewStub(channel_),
                              grpc::health::v1::HealthCheckRequest()));
  if (resp.status() != HealthCheckResponse::SERVING) {
    return absl::UnavailableError(
        absl::StrCat("kregd at ", socket_path_, " reports status ",
                     HealthCheckResponse::ServingStatus_Name(resp.status())));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::CompileTargetResult> Client::Compile(
    const v1::CompileTargetRequest& req, double timeout_s,
    const std::function<void(const std::string&)>& on_diagnostics) {
  grpc::ClientContext ctx;
  ctx.set_deadline(
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0)));
  std::unique_ptr<grpc::ClientReader<v1::CompileTargetEvent>> reader =
      stub_->CompileTarget(&ctx, req);
  v1::CompileTargetEvent event;
  std::optional<v1::CompileTargetResult> result;
  while (reader->Read(&event)) {
    if (event.has_diagnostics() && on_diagnostics) {
      on_diagnostics(event.diagnostics());
    }
    if (event.has_result()) result = event.result();
  }
  grpc::Status s = reader->Finish();
  if (!s.ok()) return FromGrpc(s);
  if (!result) return absl::InternalError("kregd sent no compile result");
  return *result;
}

}  // namespace kreg
