// A peer serves a module it holds from its store, and one it fetched and is
// binding right now from memory (docs/operator-guide.md "Sizing": a level
// of the fetch tree costs a transfer); the fetch verifies either. Real gRPC
// server and channel on loopback.
#include "daemon/cluster/module_exchange.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <set>
#include <string>

#include "catch2/catch.hpp"
#include "daemon/base/sha256.h"
#include "daemon/store/module_store.h"
#include "tests/testing/temp_dir.h"

namespace kreg {
namespace {

struct Peer {
  Peer(const std::string& dir, std::set<std::string> held,
       std::shared_ptr<const std::string> relayed)
      : store(dir),
        service(
            &store, [held](const std::string& d) { return held.count(d) > 0; },
            ModuleExchangeService::kMaxServing,
            [relayed](const std::string& d) {
              return relayed != nullptr && Sha256Digest(*relayed) == d
                         ? relayed
                         : nullptr;
            }) {
    REQUIRE(store.Init().ok());
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&service);
    server = b.BuildAndStart();
    REQUIRE(server != nullptr);
    address = "127.0.0.1:" + std::to_string(port);
  }
  ~Peer() { server->Shutdown(); }
  absl::StatusOr<std::string> Fetch(const std::string& digest, uint64_t size) {
    return FetchModuleFrom(address, digest, size,
                           grpc::InsecureChannelCredentials(), 10000);
  }

  ModuleStore store;
  ModuleExchangeService service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

TEST_CASE("A peer serves held modules from its store, relayed ones from memory",
          "[cluster]") {
  testing::TempDir dir;
  const std::string stored = "a module in the store";
  // Over two chunks of the stream.
  auto relayed = std::make_shared<const std::string>(
      std::string(2 * 1024 * 1024 + 17, 'r'));
  const std::string in_store = Sha256Digest(stored);
  const std::string in_memory = Sha256Digest(*relayed);
  Peer peer(dir.path() + "/store", {in_store}, relayed);
  REQUIRE(peer.store.Put(stored, in_store).ok());

  absl::StatusOr<std::string> got = peer.Fetch(in_store, stored.size());
  REQUIRE(got.ok());
  CHECK(*got == stored);

  got = peer.Fetch(in_memory, relayed->size());
  REQUIRE(got.ok());
  CHECK(*got == *relayed);
  // Not copied to the store by serving it.
  CHECK_FALSE(peer.store.Verify(in_memory).ok());

  const std::string other = "sha256:" + std::string(64, 'b');
  got = peer.Fetch(other, 10);
  CHECK(got.status().code() == absl::StatusCode::kNotFound);
  CHECK(got.status().message() == "peer " + peer.address +
                                      ": this kregd holds no registered "
                                      "module " +
                                      other);

  // The fetcher verifies relayed bytes like stored ones: a size other than
  // the binding's is refused.
  got = peer.Fetch(in_memory, relayed->size() - 1);
  CHECK(got.status().code() == absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace kreg
