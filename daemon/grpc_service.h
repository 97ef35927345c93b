// kreg.v1.Registry over gRPC. Translates only: parse, call the domain, fill
// the reply.
#ifndef KREGD_DAEMON_GRPC_SERVICE_H_
#define KREGD_DAEMON_GRPC_SERVICE_H_

#include <functional>
#include <string>

#include "daemon/registrar.h"
#include "daemon/registry.h"
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
  // All borrowed pointers must outlive the service.
  RegistryService(Registrar* registrar, Registry* registry, PeerOf peer_of,
                  StatusOf status_of);

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
  grpc::Status CollectGarbage(grpc::ServerContext* ctx,
                              const v1::CollectGarbageRequest* req,
                              v1::CollectGarbageResponse* resp) override;

 private:
  Registrar* const registrar_;
  Registry* const registry_;
  const PeerOf peer_of_;
  const StatusOf status_of_;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_GRPC_SERVICE_H_
