#include "daemon/cluster/etcd_decode.h"

#include "absl/strings/str_cat.h"

namespace kreg {

EtcdKv DecodeKv(const mvccpb::KeyValue& kv) {
  return EtcdKv{kv.key(),          kv.value(), kv.create_revision(),
                kv.mod_revision(), kv.lease(), kv.version()};
}

absl::StatusOr<EtcdCreate> DecodeCreate(const std::string& key,
                                        const etcdserverpb::TxnResponse& resp) {
  EtcdCreate out;
  out.created = resp.succeeded();
  out.revision = resp.header().revision();
  if (!out.created) {
    if (resp.responses_size() != 1 ||
        resp.responses(0).response_range().kvs_size() != 1) {
      // Deleted between the compare and the read: cannot happen inside one
      // transaction; report it rather than guess.
      return absl::InternalError(absl::StrCat(
          "etcd transaction on \"", key, "\" neither created nor read it"));
    }
    out.existing = DecodeKv(resp.responses(0).response_range().kvs(0));
  }
  return out;
}

EtcdRange DecodeRange(const etcdserverpb::RangeResponse& resp) {
  EtcdRange out;
  out.revision = resp.header().revision();
  for (const mvccpb::KeyValue& kv : resp.kvs()) out.kvs.push_back(DecodeKv(kv));
  return out;
}

absl::StatusOr<int64_t> DecodeLeaseGrant(
    const etcdserverpb::LeaseGrantResponse& resp) {
  if (!resp.error().empty()) {
    return absl::UnavailableError(
        absl::StrCat("etcd refused a lease: ", resp.error()));
  }
  return resp.id();
}

absl::StatusOr<int64_t> DecodeKeepAlive(
    int64_t lease, const etcdserverpb::LeaseKeepAliveResponse& resp) {
  if (resp.ttl() <= 0) {
    return absl::NotFoundError(
        absl::StrCat("etcd lease ", lease, " has expired"));
  }
  return resp.ttl();
}

absl::Status DecodeWatch(const etcdserverpb::WatchResponse& resp,
                         const std::string& endpoint, int64_t start_revision,
                         std::vector<EtcdEvent>* events) {
  if (resp.canceled()) {
    if (resp.compact_revision() > 0) {
      return absl::OutOfRangeError(absl::StrCat(
          "etcd compacted the history to revision ", resp.compact_revision(),
          " (watch from ", start_revision, ")"));
    }
    return absl::UnavailableError(absl::StrCat(
        "etcd cancelled the watch on ", endpoint, ": ", resp.cancel_reason()));
  }
  for (const mvccpb::Event& ev : resp.events()) {
    EtcdEvent e;
    e.deleted = ev.type() == mvccpb::Event::DELETE;
    e.kv = DecodeKv(ev.kv());
    if (ev.has_prev_kv()) e.prev = DecodeKv(ev.prev_kv());
    events->push_back(std::move(e));
  }
  return absl::OkStatus();
}

}  // namespace kreg
