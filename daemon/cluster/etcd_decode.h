// The decoding of etcd's v3 gRPC responses into the values EtcdClient
// returns (docs/design.md §10): pure functions over the parsed protobufs,
// apart from the client so that tests can feed them any response a member
// might send.
#ifndef KREGD_DAEMON_CLUSTER_ETCD_DECODE_H_
#define KREGD_DAEMON_CLUSTER_ETCD_DECODE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/cluster/etcd_values.h"
#include "etcd/etcdserver/etcdserverpb/rpc.pb.h"

namespace kreg {

// One key-value as etcd sent it (bytes copied verbatim, any size).
EtcdKv DecodeKv(const mvccpb::KeyValue& kv);

// CreateIfAbsent's transaction on `key`: created when it succeeded, else
// the one key-value its failure branch read. INTERNAL quoting `key` when a
// failed transaction did not carry exactly one range response with exactly
// one key-value.
absl::StatusOr<EtcdCreate> DecodeCreate(const std::string& key,
                                        const etcdserverpb::TxnResponse& resp);

// A range read: its key-values in etcd's order, and the store revision
// (0 when the response has no header).
EtcdRange DecodeRange(const etcdserverpb::RangeResponse& resp);

// A lease grant: the lease id. UNAVAILABLE with etcd's text when the
// response carries an error.
absl::StatusOr<int64_t> DecodeLeaseGrant(
    const etcdserverpb::LeaseGrantResponse& resp);

// A keep-alive of `lease`: the new TTL. NOT_FOUND naming the lease when
// the TTL is not positive (the lease has expired).
absl::StatusOr<int64_t> DecodeKeepAlive(
    int64_t lease, const etcdserverpb::LeaseKeepAliveResponse& resp);

// One message of a watch on `endpoint` started at `start_revision`: its
// events are appended to `events`, in order. A message that cancels the
// watch ends it: OUT_OF_RANGE with the compact revision when etcd
// compacted past `start_revision`, else UNAVAILABLE with etcd's reason.
absl::Status DecodeWatch(const etcdserverpb::WatchResponse& resp,
                         const std::string& endpoint, int64_t start_revision,
                         std::vector<EtcdEvent>* events);

}  // namespace kreg

#endif  // KREGD_DAEMON_CLUSTER_ETCD_DECODE_H_
