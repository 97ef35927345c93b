// Signed etcd records (DESIGN §10): whoever can write to etcd must not be
// able to forge a binding, a retirement or any other record, nor put back
// one kregd wrote earlier. Every record kregd writes is
// "kreg-sig-v2 KIND CREATE VERSION MAC\n" BODY, MAC the HMAC-SHA256 (hex)
// under the cluster key (cluster_key_file) of KIND, CREATE, VERSION, the
// etcd key and BODY. CREATE and VERSION are the record's place in the key's
// history, the key's create_revision and version (its writes since it was
// created) that the write makes: etcd gives every incarnation of a key a
// new create_revision and every write of one a higher version, so no place
// recurs, and a record put back sits at a place no signature names. A
// record cannot be altered, made by another key, turned into another kind,
// moved to another etcd key or replayed. Thread-safe (immutable).
#ifndef KREGD_DAEMON_CLUSTER_RECORD_SIGNER_H_
#define KREGD_DAEMON_CLUSTER_RECORD_SIGNER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kreg {

// What a record is; part of what is signed.
inline constexpr char kBindRecord[] = "bind";
inline constexpr char kRetireRecord[] = "retire";
inline constexpr char kCompiledRecord[] = "compiled";
inline constexpr char kReserveRecord[] = "reserve";
inline constexpr char kAckRecord[] = "ack";
inline constexpr char kHostRecord[] = "host";

// Where a record sits in its etcd key's history.
struct RecordPlace {
  int64_t create_revision = 0;  // which incarnation of the key
  int64_t version = 0;          // which write of it (1: the creating one)
  bool operator==(const RecordPlace& o) const {
    return create_revision == o.create_revision && version == o.version;
  }
};
// The place a record that creates its key is signed for: its
// create_revision is not known before the write, so it is a claim, valid
// only once sealed, by the next write of the key at {its create_revision,
// 2}, guarded by its mod_revision (see docs/design.md, cluster mode).
inline constexpr RecordPlace kCreatingWrite{0, 1};

struct SignedRecord {
  std::string kind;  // one of the k*Record above
  std::string body;
};

class RecordSigner {
 public:
  // `key`: the cluster key, at least kMinKeyBytes.
  explicit RecordSigner(std::string key) : key_(std::move(key)) {}

  static constexpr size_t kMinKeyBytes = 32;

  // The value to store under `etcd_key` at place `at`.
  std::string Sign(const std::string& etcd_key, const std::string& kind,
                   const std::string& body, RecordPlace at) const;
  // The record stored under `etcd_key` as `value`, the key being at place
  // `at` (its create_revision and version as etcd reports them).
  // UNAUTHENTICATED naming the key when it is not signed, is of the
  // earlier format kreg-sig-v1, of an unknown kind, its MAC is not this
  // cluster key's for that kind, place, key and body, or it is signed for
  // another place than `at` (a replayed record: the message says so);
  // NOT_FOUND when it is a claim not sealed yet (signed for
  // kCreatingWrite, and `at` is a key's first version): no record yet.
  absl::StatusOr<SignedRecord> Verify(const std::string& etcd_key,
                                      const std::string& value,
                                      RecordPlace at) const;

 private:
  std::string Mac(const std::string& etcd_key, const std::string& kind,
                  RecordPlace at, const std::string& body) const;

  const std::string key_;
};

// The cluster key in file `path` (cluster_key_file): its bytes, trailing
// whitespace removed. INVALID_ARGUMENT naming the file and the config key
// when it cannot be read, is readable or writable by group or others, or
// holds fewer than kMinKeyBytes.
absl::StatusOr<std::string> ReadClusterKey(const std::string& path);

}  // namespace kreg

#endif  // KREGD_DAEMON_CLUSTER_RECORD_SIGNER_H_
