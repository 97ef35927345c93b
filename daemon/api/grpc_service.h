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
#include "daemon/compile_service/compile_service.h"
#include "daemon/registry/registrar.h"
#include "daemon/registry/registration_service.h"
#include "kreg/v1/registry.grpc.pb.h"

namespace kreg {

// Maps a status to gRPC (codes are numbered alike); the message is kept.
grpc::Status ToGrpcStatus(const absl::Status& status);

// The status plus a google.rpc.Status detail carrying `error`.
grpc::Status RefusalToGrpcStatus(const absl::Status& status,
                                 const v1::KernelRegistrationError& error);

// What the service is built from; every pointer must outlive the service.
struct RegistryServiceParts {
  Registrar* registrar = nullptr;
  RegistrationService* registry = nullptr;
  // The caller of a call, from its gRPC peer string.
  std::function<PeerCred(const std::string& grpc_peer)> peer_of;
  // GetStatus's answer.
  std::function<void(v1::GetStatusResponse*)> status_of;
  // The status of kregd's GPUs (OK when it serves CUDA launches), for
  // Target.not_runnable (runnable.h); unset: CUDA counts as usable.
  std::function<absl::Status()> cuda_status_of;
  // Fills the launch statistics of one entry (Target.stats and
  // generation_stats in GetTarget); unset: never filled.
  std::function<void(const TargetEntry&, v1::Target*)> stats_of;
  // The live sessions; unset: ListSessions answers an empty list.
  std::function<void(v1::ListSessionsResponse*)> sessions_of;
  // The effective configuration; unset: GetConfig answers an empty one.
  std::function<void(v1::GetConfigResponse*)> config_of;
  // The compile service (DESIGN §13); null: CompileTarget is UNIMPLEMENTED.
  CompileService* compile = nullptr;
  // The per-uid account (DESIGN §14 rule 2; null: unbounded): a
  // RegisterTarget stream (which holds a gRPC thread while it waits on its
  // client) is charged to its peer's uid (max_grpc_calls_per_uid;
  // CompileTarget has the compile queue's own per-uid limits) and holds its
  // announced upload_size of the uid's upload bytes (the session path's
  // share too) until it is done and waits for the uid's other CPU-heavy
  // work (`heavy_work_wait`) before it is hashed and probed; it is
  // cancelled when it has not ended `stream_timeout` after it began.
  UidAccount* account = nullptr;
  absl::Duration stream_timeout = absl::Minutes(5);
  absl::Duration heavy_work_wait = absl::Seconds(20);
};

class RegistryService final : public v1::Registry::Service {
 public:
  explicit RegistryService(RegistryServiceParts parts);

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

 private:
  // What GetTarget's NOT_FOUND adds: the name's other platforms or close
  // registered names.
  std::string CloseNames(const std::string& name);

  // The charge of a streaming call of `peer` (max_grpc_calls_per_uid).
  absl::StatusOr<UidAccount::Charge> ChargeCall(const PeerCred& peer);

  RegistryServiceParts parts_;
  Registrar* const registrar_;
  RegistrationService* const registry_;
  CallDeadlines deadlines_;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_API_GRPC_SERVICE_H_
