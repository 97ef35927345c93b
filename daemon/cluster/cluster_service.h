// kreg.v1.Cluster on kregd's local socket (kregctl list --cluster,
// kregctl hosts), and the TCP server that peers fetch modules from.
// Translates only.
#ifndef KREGD_DAEMON_CLUSTER_CLUSTER_SERVICE_H_
#define KREGD_DAEMON_CLUSTER_CLUSTER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/cluster/cluster_registry.h"
#include "kreg/v1/cluster.grpc.pb.h"

namespace kreg {

class ClusterService final : public v1::Cluster::Service {
 public:
  // `cluster` may be null (not in cluster mode: FAILED_PRECONDITION); it
  // must outlive the service.
  explicit ClusterService(ClusterRegistry* cluster) : cluster_(cluster) {}

  grpc::Status ListTargets(grpc::ServerContext* ctx,
                           const v1::ListClusterTargetsRequest* req,
                           v1::ListClusterTargetsResponse* resp) override;
  grpc::Status ListHosts(grpc::ServerContext* ctx,
                         const v1::ListHostsRequest* req,
                         v1::ListHostsResponse* resp) override;

 private:
  ClusterRegistry* const cluster_;
};

// Serves `service` on `listen` (HOST:PORT), with peer TLS when `tls` is
// enabled. UNAVAILABLE (naming the address) when it cannot listen.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartPeerServer(
    const std::string& listen, const PeerTls& tls, grpc::Service* service);

}  // namespace kreg

#endif  // KREGD_DAEMON_CLUSTER_CLUSTER_SERVICE_H_
