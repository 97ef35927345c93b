// Signed etcd records (DESIGN §10): whoever can write to etcd must not be
// able to forge a binding, a retirement or a compile record. Every record
// kregd writes is "kreg-sig-v1 KIND MAC\n" BODY, MAC the HMAC-SHA256 (hex)
// under the cluster key (cluster_key_file) of KIND, the etcd key and BODY:
// a record cannot be altered, made by another key, turned into another kind
// or moved to another etcd key. Thread-safe (immutable).
#ifndef KREGD_DAEMON_CLUSTER_RECORD_SIGNER_H_
#define KREGD_DAEMON_CLUSTER_RECORD_SIGNER_H_

#include <string>

#include "absl/status/statusor.h"

namespace kreg {

// What a record is; part of what is signed.
inline constexpr char kBindRecord[] = "bind";
inline constexpr char kRetireRecord[] = "retire";
inline constexpr char kCompiledRecord[] = "compiled";
inline constexpr char kReserveRecord[] = "reserve";
inline constexpr char kAckRecord[] = "ack";

struct SignedRecord {
  std::string kind;  // one of the k*Record above
  std::string body;
};

class RecordSigner {
 public:
  // `key`: the cluster key, at least kMinKeyBytes.
  explicit RecordSigner(std::string key) : key_(std::move(key)) {}

  static constexpr size_t kMinKeyBytes = 32;

  // The value to store under `etcd_key`.
  std::string Sign(const std::string& etcd_key, const std::string& kind,
                   const std::string& body) const;
  // The record stored under `etcd_key` as `value`. UNAUTHENTICATED naming
  // the key when it is not signed, of an unknown kind, or its MAC is not
  // this cluster key's for that kind, key and body.
  absl::StatusOr<SignedRecord> Verify(const std::string& etcd_key,
                                      const std::string& value) const;

 private:
  std::string Mac(const std::string& etcd_key, const std::string& kind,
                  const std::string& body) const;

  const std::string key_;
};

// The cluster key in file `path` (cluster_key_file): its bytes, trailing
// whitespace removed. INVALID_ARGUMENT naming the file and the config key
// when it cannot be read, is readable or writable by group or others, or
// holds fewer than kMinKeyBytes.
absl::StatusOr<std::string> ReadClusterKey(const std::string& path);

}  // namespace kreg

#endif  // KREGD_DAEMON_CLUSTER_RECORD_SIGNER_H_
