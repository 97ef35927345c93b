#include "daemon/cluster/peer_tls.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "daemon/base/files.h"

namespace kreg {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  absl::StatusOr<std::string> pem = ReadFile(path, 1 << 20);
  if (!pem.ok() && !absl::IsResourceExhausted(pem.status())) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read the peer TLS ", what, " \"", path, "\" (",
                     what, " file of peer_tls_*)"));
  }
  if (!pem.ok() || !absl::StrContains(*pem, "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the peer TLS ", what, " \"", path, "\" is not a PEM file"));
  }
  return pem;
}

}  // namespace

absl::StatusOr<PeerTls> LoadPeerTls(const PeerTlsFiles& files) {
  PeerTls tls;
  const int set = !files.ca.empty() + !files.cert.empty() + !files.key.empty();
  if (set == 0) return tls;
  if (set != 3) {
    return absl::InvalidArgumentError(
        "peer TLS needs all three of peer_tls_ca, peer_tls_cert and "
        "peer_tls_key (--peer-tls-ca/-cert/-key); only some are set");
  }
  KREG_ASSIGN_OR_RETURN(tls.ca_pem, ReadPem(files.ca, "CA certificate"));
  KREG_ASSIGN_OR_RETURN(tls.cert_pem, ReadPem(files.cert, "certificate"));
  KREG_ASSIGN_OR_RETURN(tls.key_pem, ReadPem(files.key, "private key"));
  tls.enabled = true;
  return tls;
}

std::shared_ptr<grpc::ServerCredentials> PeerServerCredentials(
    const PeerTls& tls) {
  if (!tls.enabled) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions opts(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  opts.pem_root_certs = tls.ca_pem;
  opts.pem_key_cert_pairs.push_back({tls.key_pem, tls.cert_pem});
  return grpc::SslServerCredentials(opts);
}

std::shared_ptr<grpc::ChannelCredentials> PeerChannelCredentials(
    const PeerTls& tls) {
  if (!tls.enabled) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions opts;
  opts.pem_root_certs = tls.ca_pem;
  opts.pem_private_key = tls.key_pem;
  opts.pem_cert_chain = tls.cert_pem;
  return grpc::SslCredentials(opts);
}

}  // namespace kreg
