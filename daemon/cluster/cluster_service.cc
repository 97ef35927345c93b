#include "daemon/cluster/cluster_service.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace kreg {
namespace {

// Cluster-only requests on a standalone kregd: UNIMPLEMENTED (the service is
// not enabled here), which kregctl maps to exit status 2 like other misuse
// (operator guide, "Cluster mode").
absl::Status NotClustered(absl::string_view what) {
  return absl::UnimplementedError(absl::StrCat(
      "this kregd is not in cluster mode (cluster mode is off: no etcd "
      "endpoints are configured), so it has no ",
      what,
      " to list. Turn cluster mode on by starting kregd with "
      "--etcd-endpoints URL[,URL...] --advertise HOST:PORT (or etcd_endpoints "
      "and advertise in kregd.toml) to share one registry between hosts; see "
      "the operator guide, \"Cluster mode\""));
}

grpc::Status ToGrpc(const absl::Status& st) {
  return grpc::Status(static_cast<grpc::StatusCode>(st.code()),
                      std::string(st.message()));
}

}  // namespace

grpc::Status ClusterService::ListTargets(
    grpc::ServerContext* /*ctx*/, const v1::ListClusterTargetsRequest* /*req*/,
    v1::ListClusterTargetsResponse* resp) {
  if (cluster_ == nullptr) return ToGrpc(NotClustered("cluster-wide bindings"));
  absl::StatusOr<v1::ListClusterTargetsResponse> out = cluster_->ListTargets();
  if (!out.ok()) return ToGrpc(out.status());
  *resp = *std::move(out);
  return grpc::Status::OK;
}

grpc::Status ClusterService::ListHosts(grpc::ServerContext* /*ctx*/,
                                       const v1::ListHostsRequest* /*req*/,
                                       v1::ListHostsResponse* resp) {
  if (cluster_ == nullptr) return ToGrpc(NotClustered("cluster hosts"));
  absl::StatusOr<v1::ListHostsResponse> out = cluster_->ListHosts();
  if (!out.ok()) return ToGrpc(out.status());
  *resp = *std::move(out);
  return grpc::Status::OK;
}

absl::StatusOr<std::unique_ptr<grpc::Server>> StartPeerServer(
    const std::string& listen, const PeerTls& tls, grpc::Service* service) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, PeerServerCredentials(tls), &port);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen for peers on ", listen,
        " (address in use or not local?); set --peer-listen or --advertise "
        "to a free HOST:PORT of this host"));
  }
  return server;
}

}  // namespace kreg
