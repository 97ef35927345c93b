// kreg.v1.Registry over gRPC. Translates only: parse, call the domain, fill
// the reply.
#ifndef KREGD_DAEMON_API_GRPC_SERVICE_H_
#define KREGD_DAEMON_API_GRPC_SERVICE_H_

#include <functional>
#include <string>

#include "absl/time/time.h"
#include "common/wire.h"
#include "daemon/api/call_deadlines.h"
#include "daemon/base/uid_account.h"
#include "daemon/compile/compile_service.h"
#include "daemon/registry/registrar.h"
#include "daemon/registry/registration_service.h"
#include "kreg/v1/registry.grpc.pb.h"

namespace kreg {

// Maps a status to gRPC (codes are numbered alike); the message is kept.
grpc::Status ToGrpcStatus(const absl::Status& status);

// The status plus a google.rpc.Status detail carrying `error`.
grpc::Status RefusalToGrpcStatus(const absl::Status& status,
                                 const v1::KernelRegistrationError& error);

class RegistryService final : public v1::Registry::Service {
 public:
  using PeerOf = std::function<PeerCred(const std::string& grpc_peer)>;
  using StatusOf = std::function<void(v1::GetStatusResponse*)>;
  // The status of kregd's GPUs (OK when it serves CUDA launches).
  using CudaStatusOf = std::function<absl::Status()>;
  // All borrowed pointers must outlive the service.
  RegistryService(Registrar* registrar, RegistrationService* registry,
                  PeerOf peer_of, StatusOf status_of);

  grpc::Status RegisterTarget(grpc::ServerContext* ctx,
                              grpc::ServerReader<v1::RegisterTargetChunk>* in,
                              v1::RegisterTargetResponse* resp) override;
  grpc::Status ListTargets(grpc::ServerContext* ctx,
                           const v1::ListTargetsRequest* req,
                           v1::ListTargetsResponse* resp) override;
  grpc::Status GetTarget(grpc::ServerContext* ctx,
                         const v1::GetTargetRequest* req,
                         v1::GetTargetResponse* resp) override;
  grpc::Status GetStatus(grpc::ServerContext* ctx,
                         const v1::GetStatusRequest* req,
                         v1::GetStatusResponse* resp) override;
  grpc::Status RetireTarget(grpc::ServerContext* ctx,
                            const v1::RetireTargetRequest* req,
                            v1::RetireTargetResponse* resp) override;
  grpc::Status ReserveNames(grpc::ServerContext* ctx,
                            const v1::ReserveNamesRequest* req,
                            v1::ReserveNamesResponse* resp) override;
  grpc::Status CollectGarbage(grpc::ServerContext* ctx,
                              const v1::CollectGarbageRequest* req,
                              v1::CollectGarbageResponse* resp) override;
  grpc::Status ListSessions(grpc::ServerContext* ctx,
                            const v1::ListSessionsRequest* req,
                            v1::ListSessionsResponse* resp) override;
  grpc::Status GetConfig(grpc::ServerContext* ctx,
                         const v1::GetConfigRequest* req,
                         v1::GetConfigResponse* resp) override;
  grpc::Status CompileTarget(
      grpc::ServerContext* ctx, const v1::CompileTargetRequest* req,
      grpc::ServerWriter<v1::CompileTargetEvent>* out) override;

  // Fills the launch statistics of one entry (Target.stats and
  // generation_stats in GetTarget); unset: never filled.
  using StatsOf = std::function<void(const TargetEntry&, v1::Target*)>;
  void set_stats_of(StatsOf stats_of) { stats_of_ = std::move(stats_of); }
  // The live sessions; unset: ListSessions answers an empty list.
  using SessionsOf = std::function<void(v1::ListSessionsResponse*)>;
  void set_sessions_of(SessionsOf sessions_of) {
    sessions_of_ = std::move(sessions_of);
  }

  // The effective configuration; unset: GetConfig answers an empty one.
  using ConfigOf = std::function<void(v1::GetConfigResponse*)>;
  void set_config_of(ConfigOf config_of) { config_of_ = std::move(config_of); }

  // The compile service (DESIGN §13); unset: CompileTarget is UNIMPLEMENTED.
  // It must outlive the service.
  void set_compile(CompileService* compile) { compile_ = compile; }

  // Target.not_runnable (runnable.h) of targets listed or registered from
  // now on takes CUDA's status from `cuda_status_of`; unset: CUDA counts as
  // usable.
  void set_cuda_status_of(CudaStatusOf cuda_status_of) {
    cuda_status_of_ = std::move(cuda_status_of);
  }

  // The per-uid account (DESIGN §14 rule 2; null: unbounded; it must
  // outlive the service): a RegisterTarget stream (which holds a gRPC
  // thread while it waits on its client) is charged to its peer's uid
  // (max_grpc_calls_per_uid; CompileTarget has the compile queue's own
  // per-uid limits) and holds its announced
  // upload_size of the uid's upload bytes (the session path's share too)
  // until it is done and waits for the uid's other CPU-heavy work
  // (`heavy_work_wait`) before it is hashed and probed; it is cancelled
  // when it has not ended `stream_timeout` after it began.
  void set_account(UidAccount* account, absl::Duration stream_timeout,
                   absl::Duration heavy_work_wait) {
    account_ = account;
    stream_timeout_ = stream_timeout;
    heavy_work_wait_ = heavy_work_wait;
  }

 private:
  // What GetTarget's NOT_FOUND adds: the name's other platforms or close
  // registered names.
  std::string CloseNames(const std::string& name);

  Registrar* const registrar_;
  RegistrationService* const registry_;
  const PeerOf peer_of_;
  const StatusOf status_of_;
  CudaStatusOf cuda_status_of_ = [] { return absl::OkStatus(); };
  StatsOf stats_of_;
  SessionsOf sessions_of_;
  ConfigOf config_of_;
  CompileService* compile_ = nullptr;
  // The charge of a streaming call of `peer` (max_grpc_calls_per_uid).
  absl::StatusOr<UidAccount::Charge> ChargeCall(const PeerCred& peer);

  UidAccount* account_ = nullptr;
  absl::Duration stream_timeout_ = absl::Minutes(5);
  absl::Duration heavy_work_wait_ = absl::Seconds(20);
  CallDeadlines deadlines_;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_API_GRPC_SERVICE_H_
