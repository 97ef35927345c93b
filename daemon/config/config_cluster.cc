// The cluster-mode part of kregd's configuration (DESIGN §10).
#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "daemon/base/host_port.h"
#include "daemon/cluster/cluster_records.h"
#include "daemon/cluster/etcd_client.h"
#include "daemon/config/config.h"

namespace kreg {
namespace {

// INVALID_ARGUMENT when `address` (config key `key`) is not HOST:PORT.
absl::Status CheckHostPort(absl::string_view key, const std::string& address) {
  absl::StatusOr<HostPort> hp = ParseHostPort(address);
  if (hp.ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(key, " address \"", address,
                                                 "\" is not HOST:PORT (",
                                                 hp.status().message(), ")"));
}

}  // namespace

absl::Status FinishClusterConfig(Config* c) {
  for (std::string& e : c->etcd_endpoints) {
    e = std::string(absl::StripAsciiWhitespace(e));
  }
  if (c->etcd_endpoints.empty()) return absl::OkStatus();
  for (const std::string& e : c->etcd_endpoints) {
    bool tls = false;
    KREG_ASSIGN_OR_RETURN(std::string target, EtcdTarget(e, &tls));
    if (!tls && !c->cluster_insecure) {
      return absl::InvalidArgumentError(absl::StrCat(
          "etcd endpoint \"", e,
          "\" is plaintext: anyone who can reach it can read and rewrite the "
          "cluster's bindings. Use https:// (etcd with client certificate "
          "auth; kregd presents peer_tls_cert), or set cluster_insecure = "
          "true (--cluster-insecure) for a test cluster"));
    }
  }
  if (c->cluster.empty() || c->cluster.size() > 64 ||
      c->cluster.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQ"
                                   "RSTUVWXYZ0123456789_.-") !=
          std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster name \"", c->cluster,
                     "\" must be 1-64 characters of [A-Za-z0-9_.-]"));
  }
  if (c->advertise.empty()) {
    return absl::InvalidArgumentError(
        "cluster mode (--etcd-endpoints) needs --advertise HOST:PORT "
        "(advertise "
        "in the config file): the address other hosts fetch modules from");
  }
  KREG_RETURN_IF_ERROR(CheckHostPort("advertise", c->advertise));
  // What other hosts dial: the same check they apply to a peer record.
  if (!PeerAddressOk(c->advertise)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "advertise address \"", c->advertise,
        "\" is not a host name, IPv4 or [IPv6] address with a port that "
        "other hosts can dial (a gRPC scheme such as unix: or dns: is not "
        "one); use e.g. 10.0.0.5:7000"));
  }
  if (c->peer_listen.empty()) c->peer_listen = c->advertise;
  KREG_RETURN_IF_ERROR(CheckHostPort("peer_listen", c->peer_listen));
  if (c->host_name.empty()) {
    char buf[256] = {};
    ::gethostname(buf, sizeof(buf) - 1);
    c->host_name = buf[0] != '\0' ? buf : "localhost";
  }
  const int tls = !c->peer_tls_ca.empty() + !c->peer_tls_cert.empty() +
                  !c->peer_tls_key.empty();
  if (tls != 0 && tls != 3) {
    return absl::InvalidArgumentError(
        "peer TLS needs all three of peer_tls_ca, peer_tls_cert and "
        "peer_tls_key (--peer-tls-ca/-cert/-key); only some are set");
  }
  if (c->cluster_key_file.empty()) {
    return absl::InvalidArgumentError(
        "cluster mode (--etcd-endpoints) needs cluster_key_file "
        "(--cluster-key-file): a file with the cluster key, the same on every "
        "host and mode 0600, that signs the bindings in etcd so that no one "
        "else who can write to etcd can forge them (make one with: openssl "
        "rand -hex 32 > FILE; chmod 600 FILE)");
  }
  return absl::OkStatus();
}

}  // namespace kreg
