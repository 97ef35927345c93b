// TLS between kregd hosts (module exchange): one CA, a certificate and key
// per host; both ends present a certificate and verify the other's.
#ifndef KREGD_DAEMON_CLUSTER_PEER_TLS_H_
#define KREGD_DAEMON_CLUSTER_PEER_TLS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kreg {

// PEM file paths; all empty: no TLS (plaintext between hosts).
struct PeerTlsFiles {
  std::string ca;
  std::string cert;
  std::string key;
  bool enabled() const { return !ca.empty(); }
};

// The PEM contents, read once at start-up.
struct PeerTls {
  bool enabled = false;
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
};

// Reads the files. INVALID_ARGUMENT when only some are set, or one cannot
// be read or holds no PEM block (the path is quoted).
absl::StatusOr<PeerTls> LoadPeerTls(const PeerTlsFiles& files);

// Server side: with TLS, a client certificate signed by the CA is required.
std::shared_ptr<grpc::ServerCredentials> PeerServerCredentials(
    const PeerTls& tls);
// Client side: with TLS, the server's certificate must be signed by the CA
// (and name the host dialled); ours is presented.
std::shared_ptr<grpc::ChannelCredentials> PeerChannelCredentials(
    const PeerTls& tls);

}  // namespace kreg

#endif  // KREGD_DAEMON_CLUSTER_PEER_TLS_H_
