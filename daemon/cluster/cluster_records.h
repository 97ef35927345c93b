// What cluster mode reads from etcd (DESIGN §10): binding, host, reservation
// and acknowledgement records, written by other hosts and so hostile input,
// decoded and validated here once. Pure functions; thread-safe.
#ifndef KREGD_DAEMON_CLUSTER_CLUSTER_RECORDS_H_
#define KREGD_DAEMON_CLUSTER_CLUSTER_RECORDS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/base/types.h"
#include "daemon/cluster/record_signer.h"
#include "daemon/registry/repointer.h"
#include "google/protobuf/message.h"
#include "kreg/v1/cluster.pb.h"

namespace kreg {

// A record's JSON (proto field names), as kregd writes it to etcd.
std::string RecordJson(const google::protobuf::Message& m);
// Parses a record's JSON, ignoring fields of newer kregd versions.
bool RecordFromJson(const std::string& json, google::protobuf::Message* m);

// The etcd key of `key`'s binding: "<prefix>targets/<platform>/<name>".
std::string BindingKey(const std::string& prefix, const TargetKey& key);

// The binding stored under etcd key `key` (`value`: a kreg.v1.Target's
// JSON), with every field checked as a registration's would be: FromProto's
// errors (name, platform, kind); DATA_LOSS naming the key when the value is
// not a binding, has an invalid function name or content id, a module
// binding's digest is not "sha256:" and 64 lowercase hex (these checks
// also for each of its generations, which must ascend and end with the
// binding's own generation and module), or it holds the binding of another
// target than its key names.
absl::StatusOr<TargetEntry> ParseBindingRecord(const std::string& prefix,
                                               const std::string& key,
                                               const std::string& value);

// A signed record under a binding key: a binding, or the retirement
// (tombstone) of the binding `entry`.
struct BindingRecord {
  TargetEntry entry;
  bool retired = false;
};

// The signed record stored under binding key `key`, the key being at
// place `at`: `signer.Verify`'s UNAUTHENTICATED when its signature is
// missing or bad or it is signed for another place (replayed), NOT_FOUND
// when it is a claim not sealed yet; DATA_LOSS when it is signed but
// neither a binding nor a retirement; else ParseBindingRecord's checks of
// its body.
absl::StatusOr<BindingRecord> ParseSignedBinding(const RecordSigner& signer,
                                                 const std::string& prefix,
                                                 const std::string& key,
                                                 const std::string& value,
                                                 RecordPlace at);

// The etcd key of the name reservation of `pattern`:
// "<prefix>reservations/<pattern>".
std::string ReservationKey(const std::string& prefix,
                           const std::string& pattern);

// A signed record under a reservation key: a reservation or its lifting
// (kreg.v1.ReservationRecord's JSON, `lifted` set).
struct ReservationEvent {
  NameReservation reservation;
  bool lifted = false;
};

// The signed record stored under reservation key `key` at place `at`:
// `signer.Verify`'s errors (a replayed lifting or reservation among them);
// DATA_LOSS naming
// the key when it is signed but not a reservation, its pattern is not one
// `kregctl reserve` accepts, or it reserves another pattern than its key
// names.
absl::StatusOr<ReservationEvent> ParseSignedReservation(
    const RecordSigner& signer, const std::string& prefix,
    const std::string& key, const std::string& value, RecordPlace at);
// The body of the record of `r` (`lifted`: its lifting).
std::string ReservationJson(const NameReservation& r, bool lifted);

// The etcd key of `address`'s acknowledgement of a replacement of `key`
// (docs/replace.md §9): "<prefix>acks/<platform>/<name>/<address>";
// AckKey(prefix, key, "") is the prefix of every host's.
std::string AckKey(const std::string& prefix, const TargetKey& key,
                   const std::string& address);
// The body of an acknowledgement (kreg.v1.ClusterAck's JSON) of
// `generation`, made at `made_at_us` (its Generation::at_us).
std::string AckJson(uint32_t generation, int64_t made_at_us,
                    const std::vector<Repointer::Laggard>& laggards,
                    const std::string& error);

// The largest acknowledgement record kregd reads (signature included), and
// the longest error or laggard's reason in it.
constexpr size_t kMaxAckRecordBytes = 64u << 10;
constexpr size_t kMaxAckTextBytes = 1024;

// A host's acknowledgement, as ParseSignedAck read it.
struct AckRecord {
  std::string address;  // the host's, from the key
  uint32_t generation = 0;
  int64_t made_at_us = 0;
  std::vector<Repointer::Laggard> laggards;  // their host not set
  std::string error;
};

// The signed acknowledgement stored under etcd key `etcd_key` for `key`,
// the etcd key being at place `at`:
// DATA_LOSS naming the key when the value is longer than
// kMaxAckRecordBytes, the key is not AckKey(prefix, key, ADDRESS) with an
// ADDRESS that passes PeerAddressOk, the signed body is not an
// acknowledgement, its generation is 0, a laggard has pid 0 or does not
// run an earlier generation, or a text is longer than kMaxAckTextBytes or
// holds control characters; `signer.Verify`'s UNAUTHENTICATED when it is
// not signed with the cluster key or for place `at` (NOT_FOUND: not
// sealed yet).
absl::StatusOr<AckRecord> ParseSignedAck(
    const RecordSigner& signer, const std::string& prefix, const TargetKey& key,
    const std::string& etcd_key, const std::string& value, RecordPlace at);

// Whether `digest` is "sha256:" followed by 64 lowercase hex.
bool WellFormedDigest(const std::string& digest);

// Whether `address` is what a peer may be fetched from: HOST:PORT with a
// host name or IPv4 address ([A-Za-z0-9.-_]) or a bracketed IPv6 address,
// and a port in 1..65535 — never a gRPC target scheme ("unix:", "dns:"),
// also where it would parse as HOST:PORT ("unix:1" dials the socket "1").
bool PeerAddressOk(const std::string& address);

// A peer's host record (`value`: a kreg.v1.ClusterHost's JSON). DATA_LOSS
// when it does not parse, its address fails PeerAddressOk or one of its
// module digests is not "sha256:" and 64 lowercase hex.
absl::StatusOr<v1::ClusterHost> ParseHostRecord(const std::string& value);

// The etcd key of the host record of `address`: "<prefix>peers/<address>".
std::string HostKey(const std::string& prefix, const std::string& address);

// The signed host record under etcd key `etcd_key` at place `at`:
// `signer.Verify`'s errors (NOT_FOUND: not sealed yet); DATA_LOSS naming
// the key when it is signed but not a host record, fails ParseHostRecord,
// or is the record of another address than its key names.
absl::StatusOr<v1::ClusterHost> ParseSignedHostRecord(
    const RecordSigner& signer, const std::string& prefix,
    const std::string& etcd_key, const std::string& value, RecordPlace at);

}  // namespace kreg

#endif  // KREGD_DAEMON_CLUSTER_CLUSTER_RECORDS_H_
