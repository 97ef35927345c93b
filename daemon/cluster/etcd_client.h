// A small client of etcd's v3 gRPC API (KV, Watch, Lease): the calls
// cluster mode needs, with fail-over between the members given.
#ifndef KREGD_DAEMON_CLUSTER_ETCD_CLIENT_H_
#define KREGD_DAEMON_CLUSTER_ETCD_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/cluster/etcd_values.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace kreg {

// One endpoint: "http://host:port", "https://host:port" or "host:port"
// (http). INVALID_ARGUMENT quoting it otherwise.
absl::StatusOr<std::string> EtcdTarget(const std::string& endpoint, bool* tls);

// The range_end that makes a range cover every key starting with `prefix`.
std::string PrefixEnd(const std::string& prefix);

struct EtcdOptions {
  std::vector<std::string> endpoints;  // checked by EtcdTarget
  // Per call, across the members tried.
  int64_t timeout_ms = 5000;
  // For https:// endpoints; null: the system's roots, no client cert.
  std::shared_ptr<grpc::ChannelCredentials> tls;
  // The member asked first (modulo their number): hosts that pass
  // different values spread their calls and watches over the members
  // instead of all asking the first (docs/operator-guide.md, "Sizing").
  size_t first_member = 0;
  // A watch whose member sent nothing, not even the answer to a progress
  // request (sent every watch_probe_ms), for watch_stall_ms is ended as
  // UNAVAILABLE: a member cut off keeps its connections open but silent.
  int64_t watch_probe_ms = 2000;
  int64_t watch_stall_ms = 6000;
};

// Owns one channel per member. Every call tries the member that answered
// last first, then the others, within the timeout; a member that is down
// or without quorum is skipped. Errors: UNAVAILABLE (no member answered,
// the message lists the endpoints and the last error), or etcd's own.
// Thread-safe.
class EtcdClient {
 public:
  // The endpoints must have passed EtcdTarget.
  explicit EtcdClient(EtcdOptions options);
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // One transaction: if `key` was never created (create_revision == 0),
  // put `value` (with `lease` unless 0); else read it.
  absl::StatusOr<EtcdCreate> CreateIfAbsent(const std::string& key,
                                            const std::string& value,
                                            int64_t lease = 0);
  // `key` alone, or every key under it when `prefix`. Linearizable.
  absl::StatusOr<EtcdRange> Range(const std::string& key, bool prefix);
  // Puts `value` under `key` (with `lease` unless 0) if its mod_revision is
  // still `mod_revision`: true when put, false when it changed or is gone.
  absl::StatusOr<bool> PutIfUnchanged(const std::string& key,
                                      const std::string& value,
                                      int64_t mod_revision, int64_t lease = 0);
  absl::Status Put(const std::string& key, const std::string& value,
                   int64_t lease);
  // How many keys start with `prefix` (a count-only range: no values).
  absl::StatusOr<int64_t> Count(const std::string& prefix);
  // A new lease of `ttl_s` seconds; its id.
  absl::StatusOr<int64_t> GrantLease(int64_t ttl_s);
  // Renews `lease`; the new TTL. NOT_FOUND when it has expired.
  absl::StatusOr<int64_t> KeepAlive(int64_t lease);
  // Seconds left of `lease` (-1: expired).
  absl::StatusOr<int64_t> TimeToLive(int64_t lease);
  absl::Status Revoke(int64_t lease);

  // Watches every key in [key, range_end) from `start_revision` and calls
  // `on_event` for each event, in order, until the stream ends;
  // `on_watching` (the member's endpoint) once the member has accepted the
  // watch. Returns UNAVAILABLE when the member went away, lost its leader
  // or went silent (watch_stall_ms; reconnect and resume), OUT_OF_RANGE
  // when `start_revision` was compacted (re-read the range), CANCELLED
  // after CancelWatches. `*last_revision` is the revision of the last event
  // delivered.
  absl::Status Watch(const std::string& key, const std::string& range_end,
                     int64_t start_revision,
                     const std::function<void(const EtcdEvent&)>& on_event,
                     const std::function<void(const std::string&)>& on_watching,
                     int64_t* last_revision);
  // Ends every Watch in progress and any started later.
  void CancelWatches();

  // "http://a:2379,http://b:2379", for messages.
  const std::string& endpoints_text() const { return endpoints_text_; }

 private:
  struct Member {
    std::string endpoint;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<etcdserverpb::KV::Stub> kv;
    std::unique_ptr<etcdserverpb::Watch::Stub> watch;
    std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  };
  // Runs `call` on one member after another until one answers with other
  // than UNAVAILABLE/DEADLINE_EXCEEDED; the first such answer is returned.
  absl::Status OnAnyMember(
      const std::string& what,
      const std::function<grpc::Status(Member&, grpc::ClientContext*)>& call);

  const EtcdOptions options_;
  std::string endpoints_text_;
  std::vector<Member> members_;
  std::atomic<size_t> preferred_{0};
  absl::Mutex watch_mu_;
  bool watches_cancelled_ ABSL_GUARDED_BY(watch_mu_) = false;
  std::set<grpc::ClientContext*> watches_ ABSL_GUARDED_BY(watch_mu_);
};

}  // namespace kreg

#endif  // KREGD_DAEMON_CLUSTER_ETCD_CLIENT_H_
