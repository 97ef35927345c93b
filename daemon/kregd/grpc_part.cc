// kregd's gRPC part (parts.h): the server on the gRPC socket.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_posix.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "daemon/api/grpc_service.h"
#include "daemon/cluster/cluster_service.h"
#include "daemon/kregd/parts.h"
#include "daemon/registry/runnable.h"
#include "daemon/supervisor/supervision_service.h"

namespace kreg {
namespace {

// GetConfig's answer: the effective configuration and where each key came
// from.
void FillConfig(const Config& config, v1::GetConfigResponse* r) {
  for (const ConfigEntry& e : DescribeConfig(config)) {
    v1::ConfigValue* v = r->add_values();
    v->set_key(e.key);
    v->set_value_toml(e.value_toml);
    v->set_origin(e.origin);
  }
  r->set_toml(ConfigToml(config));
  r->set_config_file(config.config_file);
}

}  // namespace

GrpcPart::GrpcPart(DaemonCore* core, const ClusterPart* cluster,
                   const CompilePart* compile, SessionsPart* sessions,
                   std::function<void(v1::GetStatusResponse*)> status_of)
    : core_(core),
      config_(core->config),
      cluster_(cluster),
      compile_(compile),
      sessions_(sessions),
      status_of_(std::move(status_of)),
      connections_(
          GrpcConnectionLimits{
              config_.max_grpc_connections,
              std::chrono::milliseconds(static_cast<int64_t>(
                  config_.grpc_first_message_timeout_s * 1000.0))},
          &core->account, [this](int fd) {
            grpc::AddInsecureChannelFromFd(server_.get(), fd);
          }) {}

GrpcPart::~GrpcPart() = default;

absl::Status GrpcPart::Start() {
  RegistryServiceParts parts;
  parts.registrar = &core_->registrar;
  parts.registry = &core_->registry;
  parts.peer_of = [this](const std::string& peer) {
    return connections_.PeerOf(peer);
  };
  parts.status_of = status_of_;
  // Whether executors here can run CUDA launches (driver and a device; no
  // context is created in kregd), for Target.not_runnable.
  parts.cuda_status_of = [] { return CudaLaunchStatus(); };
  parts.stats_of = [this](const TargetEntry& e, v1::Target* t) {
    StatsOf(sessions_->pool(), e, t);
  };
  parts.sessions_of = [this](v1::ListSessionsResponse* r) {
    sessions_->ListSessions(r);
  };
  parts.config_of = [this](v1::GetConfigResponse* r) {
    FillConfig(config_, r);
  };
  parts.compile = compile_->service();
  parts.account = &core_->account;
  parts.stream_timeout =
      absl::Milliseconds(config_.grpc_stream_timeout_s * 1000.0);
  parts.heavy_work_wait = absl::Milliseconds(config_.probe_timeout_s * 1000.0);
  service_ = std::make_unique<RegistryService>(std::move(parts));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.RegisterService(service_.get());
  supervision_ = std::make_unique<SupervisionService>(
      &core_->ledger,
      [this](const std::string& peer) { return connections_.PeerOf(peer); });
  builder.RegisterService(supervision_.get());
  builder.RegisterService(cluster_->service());
  builder.SetMaxReceiveMessageSize(8 << 20);
  // A connection with no call in flight for grpc_stream_timeout_s is
  // closed (GOAWAY; clients reconnect when they next call): one that sent
  // its first bytes and then stalled holds nothing for longer.
  builder.AddChannelArgument(
      GRPC_ARG_MAX_CONNECTION_IDLE_MS,
      static_cast<int>(config_.grpc_stream_timeout_s * 1000.0));
  // One connection opens at most this many streams at once, and all calls
  // together get at most grpc_max_threads threads: a call beyond them is
  // refused (RESOURCE_EXHAUSTED), not given a thread of its own.
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             config_.max_grpc_streams_per_connection);
  grpc::ResourceQuota quota("kregd-grpc");
  quota.SetMaxThreads(config_.grpc_max_threads);
  builder.SetResourceQuota(quota);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    return absl::InternalError("the gRPC server could not be started");
  }
  // grpc.health.v1 answers for the whole server ("") and, by name, for the
  // service clients actually use.
  server_->GetHealthCheckService()->SetServingStatus("kreg.v1.Registry", true);
  stop_fd_.reset(::eventfd(0, EFD_CLOEXEC));
  accept_thread_ = std::thread(
      [this] { connections_.Run(core_->listen_fd, stop_fd_.get()); });
  return absl::OkStatus();
}

void GrpcPart::Quiesce() {
  if (stop_fd_.ok()) {
    uint64_t one = 1;
    (void)!::write(stop_fd_.get(), &one, sizeof(one));
  }
  if (accept_thread_.joinable()) accept_thread_.join();
}

void GrpcPart::Stop() {
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(5));
  }
}

}  // namespace kreg
