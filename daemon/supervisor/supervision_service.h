// kreg.v1.Supervision over gRPC: crash counts and quarantine. Translates
// only.
#ifndef KREGD_DAEMON_SUPERVISOR_SUPERVISION_SERVICE_H_
#define KREGD_DAEMON_SUPERVISOR_SUPERVISION_SERVICE_H_

#include <functional>
#include <string>

#include "daemon/base/types.h"
#include "daemon/supervisor/crash_ledger.h"
#include "kreg/v1/supervision.grpc.pb.h"

namespace kreg {

class SupervisionService final : public v1::Supervision::Service {
 public:
  using PeerOf = std::function<PeerCred(const std::string& grpc_peer)>;
  // `ledger` must outlive the service.
  SupervisionService(CrashLedger* ledger, PeerOf peer_of);

  grpc::Status ListCrashes(grpc::ServerContext* ctx,
                           const v1::ListCrashesRequest* req,
                           v1::ListCrashesResponse* resp) override;
  // PERMISSION_DENIED when a caller who is neither root nor kregd's uid
  // asks for another uid's row; NOT_FOUND when nothing was quarantined.
  grpc::Status Unquarantine(grpc::ServerContext* ctx,
                            const v1::UnquarantineRequest* req,
                            v1::UnquarantineResponse* resp) override;

 private:
  CrashLedger* const ledger_;
  const PeerOf peer_of_;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_SUPERVISOR_SUPERVISION_SERVICE_H_
