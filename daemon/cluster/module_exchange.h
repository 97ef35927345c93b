// Module bytes between kregd hosts: the kreg.v1.ModuleExchange service
// (serving this host's store copies) and the fetch from a peer.
#ifndef KREGD_DAEMON_CLUSTER_MODULE_EXCHANGE_H_
#define KREGD_DAEMON_CLUSTER_MODULE_EXCHANGE_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/store/module_store.h"
#include "kreg/v1/cluster.grpc.pb.h"

namespace kreg {

// Serves the store copy of a digest that `held` says this host holds for a
// registered target, else the bytes `relayed` returns (a module this host
// fetched, verified and binds right now), else NOT_FOUND (INVALID_ARGUMENT
// for a malformed digest). Sends the bytes as they are: the receiver
// verifies. At most
// `max_serving` fetches at once: more are answered UNAVAILABLE ("busy"), so
// that the hosts which all lack a new module at once (its registration
// seen everywhere together) spread over the peers that got it first
// instead of all reading it from the registering host.
class ModuleExchangeService final : public v1::ModuleExchange::Service {
 public:
  using Held = std::function<bool(const std::string& digest)>;
  using Relayed =
      std::function<std::shared_ptr<const std::string>(const std::string&)>;
  static constexpr int kMaxServing = 4;
  // `store` must outlive the service.
  ModuleExchangeService(const ModuleStore* store, Held held,
                        int max_serving = kMaxServing,
                        Relayed relayed = nullptr);

  grpc::Status FetchModule(grpc::ServerContext* ctx,
                           const v1::FetchModuleRequest* req,
                           grpc::ServerWriter<v1::ModuleChunk>* out) override;

 private:
  const ModuleStore* const store_;
  const Held held_;
  const int max_serving_;
  const Relayed relayed_;
  std::atomic<int> serving_{0};
};

// Assembles module `digest` of `size` bytes from the chunks a peer streams
// (hostile input): the first chunk must announce `size` (total_size), the
// bytes kept never exceed `size` (checked before a chunk is kept), and
// Finish wants exactly `size` bytes that hash to `digest`. Every refusal is
// DATA_LOSS naming `peer` and the digest(s); after one, Add refuses again
// and nothing more is kept. Not thread-safe.
class ModuleAssembler {
 public:
  ModuleAssembler(std::string peer, std::string digest, uint64_t size);
  ModuleAssembler(const ModuleAssembler&) = delete;
  ModuleAssembler& operator=(const ModuleAssembler&) = delete;

  absl::Status Add(const v1::ModuleChunk& chunk);
  // Once the stream ended without error: the verified bytes.
  absl::StatusOr<std::string> Finish();
  uint64_t held() const { return bytes_.size(); }

 private:
  const std::string peer_;
  const std::string digest_;
  const uint64_t size_;
  bool first_ = true;
  absl::Status bad_;
  std::string bytes_;
};

// Fetches module `digest` from the peer at `address` (HOST:PORT) and
// verifies it: the size announced and received must be `size` (checked
// before more is read) and the bytes must hash to `digest`. DATA_LOSS
// (naming the peer and both digests) for other bytes, the peer's status
// otherwise (UNAVAILABLE when it cannot be reached or the TLS handshake
// fails).
absl::StatusOr<std::string> FetchModuleFrom(
    const std::string& address, const std::string& digest, uint64_t size,
    const std::shared_ptr<grpc::ChannelCredentials>& creds, int64_t timeout_ms);

}  // namespace kreg

#endif  // KREGD_DAEMON_CLUSTER_MODULE_EXCHANGE_H_
