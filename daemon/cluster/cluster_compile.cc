// ClusterRegistry: the compile service across hosts (DESIGN §13,
// docs/operator-guide.md "The compile service"). A host that built a
// module for a cache key records its digest in etcd; another host asks etcd
// for the key before compiling and fetches the module from a peer, verified
// against that digest (FetchModule).
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "daemon/cluster/cluster_records.h"
#include "daemon/cluster/cluster_registry.h"
#include "spdlog/spdlog.h"

namespace kreg {

absl::StatusOr<std::optional<ClusterRegistry::CompiledModule>>
ClusterRegistry::FindCompiled(const std::string& key_hex) {
  const std::string key = absl::StrCat(prefix_, "compiled/", key_hex);
  KREG_ASSIGN_OR_RETURN(EtcdRange r, etcd_.Range(key, false));
  if (r.kvs.empty()) return std::nullopt;
  // Signed "<digest> <size>" at its place; anything else is ignored (and
  // compiled here), a record not sealed yet silently.
  const EtcdKv& kv = r.kvs[0];
  absl::StatusOr<SignedRecord> signed_record =
      signer_.Verify(key, kv.value, {kv.create_revision, kv.version});
  if (!signed_record.ok() || signed_record->kind != kCompiledRecord) {
    Ignored(signed_record.ok() ? absl::DataLossError(absl::StrCat(
                                     "etcd key ", key, " is no compile record"))
                               : signed_record.status());
    return std::nullopt;
  }
  std::vector<std::string> parts = absl::StrSplit(signed_record->body, ' ');
  CompiledModule m;
  if (parts.size() != 2 || !WellFormedDigest(parts[0]) ||
      !absl::SimpleAtoi(parts[1], &m.size)) {
    spdlog::warn("cluster: etcd's record of compile {} is malformed; ignored",
                 key_hex);
    return std::nullopt;
  }
  m.digest = parts[0];
  return m;
}

absl::Status ClusterRegistry::RecordCompiled(const std::string& key_hex,
                                             const CompiledModule& module) {
  const std::string key = absl::StrCat(prefix_, "compiled/", key_hex);
  // First record wins: created (and sealed) only where none is.
  return WriteAfter(key, kCompiledRecord,
                    absl::StrCat(module.digest, " ", module.size), nullptr, 0)
      .status();
}

absl::StatusOr<int64_t> ClusterRegistry::ClaimCompile(
    const std::string& key_hex, int64_t ttl_s) {
  KREG_ASSIGN_OR_RETURN(int64_t lease, etcd_.GrantLease(ttl_s));
  absl::StatusOr<EtcdCreate> c = etcd_.CreateIfAbsent(
      absl::StrCat(prefix_, "compiling/", key_hex), host_id_, lease);
  if (!c.ok() || !c->created) {
    (void)etcd_.Revoke(lease);
    if (!c.ok()) return c.status();
    return 0;
  }
  return lease;
}

void ClusterRegistry::ReleaseCompile(int64_t lease) {
  if (lease == 0) return;
  if (absl::Status s = etcd_.Revoke(lease); !s.ok()) {
    spdlog::warn("cluster: ending a compile claim: {}",
                 std::string(s.message()));
  }
}

}  // namespace kreg
