// kregd's cluster part (parts.h, DESIGN §10).
#include <functional>

#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "daemon/cluster/cluster_mirror.h"
#include "daemon/cluster/cluster_registry.h"
#include "daemon/cluster/cluster_service.h"
#include "daemon/cluster/module_exchange.h"
#include "daemon/kregd/parts.h"
#include "spdlog/spdlog.h"

namespace kreg {

ClusterPart::ClusterPart(DaemonCore* core)
    : core_(core), config_(core->config) {}

ClusterPart::~ClusterPart() = default;

absl::Status ClusterPart::Start() {
  if (config_.etcd_endpoints.empty()) {
    service_ = std::make_unique<ClusterService>(nullptr);
    return absl::OkStatus();
  }
  KREG_ASSIGN_OR_RETURN(PeerTls tls,
                        LoadPeerTls({config_.peer_tls_ca, config_.peer_tls_cert,
                                     config_.peer_tls_key}));
  if (!tls.enabled) {
    spdlog::warn(
        "cluster mode without peer TLS: module bytes travel in plaintext and "
        "any client that reaches {} can fetch registered modules (digests "
        "are still verified); set peer_tls_ca/cert/key between real hosts",
        config_.peer_listen);
  }
  KREG_ASSIGN_OR_RETURN(std::string key,
                        ReadClusterKey(config_.cluster_key_file));
  if (config_.cluster_insecure) {
    spdlog::warn(
        "cluster_insecure: etcd ({}) may be reached in plaintext; bindings "
        "are still signed with the cluster key",
        absl::StrJoin(config_.etcd_endpoints, ","));
  }
  ClusterOptions opts;
  opts.key = std::move(key);
  opts.cluster = config_.cluster;
  opts.host_name = config_.host_name;
  opts.advertise = config_.advertise;
  opts.etcd.endpoints = config_.etcd_endpoints;
  opts.etcd.timeout_ms = static_cast<int64_t>(config_.etcd_timeout_s * 1000);
  // Hosts spread over the etcd members (docs/operator-guide.md, "Sizing").
  opts.etcd.first_member = std::hash<std::string>{}(config_.advertise);
  // https:// etcd endpoints use the peer CA and certificate too.
  if (tls.enabled) opts.etcd.tls = PeerChannelCredentials(tls);
  opts.tls = tls;
  opts.lease_ttl_s = config_.peer_lease_ttl_s;
  opts.max_module_bytes = config_.max_module_bytes;
  cluster_ = std::make_unique<ClusterRegistry>(std::move(opts), &core_->store);
  service_ = std::make_unique<ClusterService>(cluster_.get());
  ClusterRegistry* cluster = cluster_.get();
  exchange_ = std::make_unique<ModuleExchangeService>(
      &core_->store,
      [cluster](const std::string& digest) {
        return cluster->Held().count(digest) > 0;
      },
      ModuleExchangeService::kMaxServing,
      [cluster](const std::string& digest) {
        return cluster->Relayed(digest);
      });
  KREG_ASSIGN_OR_RETURN(
      peer_server_, StartPeerServer(config_.peer_listen, tls, exchange_.get()));
  mirror_ = std::make_unique<ClusterMirror>(
      &core_->registry.core(), &core_->registry.reservations(),
      &core_->registry.replacement(), cluster_.get());
  cluster_->Start(mirror_.get());
  return absl::OkStatus();
}

void ClusterPart::Stop() {
  if (peer_server_ != nullptr) {
    peer_server_->Shutdown(std::chrono::system_clock::now() +
                           std::chrono::seconds(2));
  }
  if (cluster_ != nullptr) cluster_->Stop();
}

}  // namespace kreg
