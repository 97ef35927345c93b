#include "daemon/cluster/cluster_records.h"

#include <google/protobuf/util/json_util.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "daemon/base/host_port.h"
#include "daemon/base/validate.h"
#include "daemon/registry/target_proto.h"
#include "kreg/v1/journal.pb.h"

namespace kreg {
namespace {

// At most this much of a hostile value goes into a message.
std::string Quoted(const std::string& s) {
  return absl::StrCat("\"", absl::CEscape(s.substr(0, 80)),
                      s.size() > 80 ? "...\"" : "\"");
}

}  // namespace

std::string RecordJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, opts);
  return out;
}

bool RecordFromJson(const std::string& json, google::protobuf::Message* m) {
  google::protobuf::util::JsonParseOptions opts;
  opts.ignore_unknown_fields = true;  // records of newer kregd versions
  return google::protobuf::util::JsonStringToMessage(json, m, opts).ok();
}

bool WellFormedDigest(const std::string& digest) {
  if (digest.size() != 7 + 64 || !absl::StartsWith(digest, "sha256:")) {
    return false;
  }
  for (size_t i = 7; i < digest.size(); ++i) {
    char c = digest[i];
    if (!absl::ascii_isdigit(c) && !(c >= 'a' && c <= 'f')) return false;
  }
  return true;
}

std::string BindingKey(const std::string& prefix, const TargetKey& key) {
  return absl::StrCat(prefix, "targets/", PlatformName(key.platform), "/",
                      key.name);
}

absl::StatusOr<TargetEntry> ParseBindingRecord(const std::string& prefix,
                                               const std::string& key,
                                               const std::string& value) {
  v1::Target t;
  if (!RecordFromJson(value, &t)) {
    return absl::DataLossError(absl::StrCat("etcd key ", Quoted(key),
                                            " does not hold a kreg binding"));
  }
  KREG_ASSIGN_OR_RETURN(TargetEntry e, FromProto(t));
  // What a registration on any host would have been refused for.
  auto check = [&](const std::string& func, const std::string& cid,
                   const std::string& digest) {
    absl::Status st = ValidateFuncName(func);
    if (st.ok()) st = ValidateContentId(cid);
    if (st.ok() && e.kind == TargetKind::kModule && !WellFormedDigest(digest)) {
      st = absl::InvalidArgumentError(
          absl::StrCat("module digest ", Quoted(digest),
                       " is not \"sha256:\" followed by 64 lowercase hex"));
    }
    return st;
  };
  absl::Status st = check(e.func_name, e.content_id, e.module_digest);
  // Every generation too (a pin loads its module): ascending, the last
  // one the binding's own (docs/replace.md §9).
  uint32_t before = 0;
  for (const Generation& g : e.generations) {
    if (!st.ok()) break;
    st = check(g.func_name, g.content_id, g.module_digest);
    if (st.ok() && g.generation <= before) {
      st = absl::InvalidArgumentError(
          absl::StrCat("its generations are not in ascending order (",
                       g.generation, " after ", before, ")"));
    }
    if (!st.ok()) {
      st = absl::InvalidArgumentError(
          absl::StrCat("generation ", g.generation, ": ", st.message()));
    }
    before = g.generation;
  }
  if (st.ok() && !e.generations.empty() &&
      (before != e.generation ||
       e.generations.back().module_digest != e.module_digest)) {
    st = absl::InvalidArgumentError(absl::StrCat(
        "its last generation (", before, ", module ",
        e.generations.back().module_digest, ") is not its current one (",
        e.generation, ", module ", e.module_digest, ")"));
  }
  if (!st.ok()) {
    return absl::DataLossError(absl::StrCat(
        "etcd key ", Quoted(key), " holds an invalid binding: ", st.message()));
  }
  if (BindingKey(prefix, e.key) != key) {
    return absl::DataLossError(absl::StrCat(
        "etcd key ", Quoted(key), " holds the binding of ", Named(e.key)));
  }
  return e;
}

absl::StatusOr<BindingRecord> ParseSignedBinding(const RecordSigner& signer,
                                                 const std::string& prefix,
                                                 const std::string& key,
                                                 const std::string& value,
                                                 RecordPlace at) {
  KREG_ASSIGN_OR_RETURN(SignedRecord r, signer.Verify(key, value, at));
  if (r.kind != kBindRecord && r.kind != kRetireRecord) {
    return absl::DataLossError(absl::StrCat("etcd key ", Quoted(key),
                                            " holds a ", r.kind,
                                            " record, not a binding"));
  }
  KREG_ASSIGN_OR_RETURN(TargetEntry e, ParseBindingRecord(prefix, key, r.body));
  return BindingRecord{std::move(e), r.kind == kRetireRecord};
}

std::string ReservationKey(const std::string& prefix,
                           const std::string& pattern) {
  return absl::StrCat(prefix, "reservations/", pattern);
}

std::string ReservationJson(const NameReservation& r, bool lifted) {
  v1::ReservationRecord p;
  p.set_pattern(r.pattern);
  p.set_group(r.group);
  p.set_owner(r.owner);
  p.set_uid(r.by.uid);
  p.set_gid(r.by.gid);
  p.set_pid(r.by.pid);
  p.set_at_us(r.at_us);
  p.set_lifted(lifted);
  return RecordJson(p);
}

absl::StatusOr<ReservationEvent> ParseSignedReservation(
    const RecordSigner& signer, const std::string& prefix,
    const std::string& key, const std::string& value, RecordPlace at) {
  KREG_ASSIGN_OR_RETURN(SignedRecord r, signer.Verify(key, value, at));
  v1::ReservationRecord p;
  if (r.kind != kReserveRecord || !RecordFromJson(r.body, &p)) {
    return absl::DataLossError(
        absl::StrCat("etcd key ", Quoted(key), " does not hold a reservation"));
  }
  // The pattern as `kregctl reserve` checks it; the owner is a number.
  absl::StatusOr<NameReservation> parsed = ParseReservation(
      p.pattern(), absl::StrCat(p.group() ? "group:" : "", p.owner()));
  if (!parsed.ok()) {
    return absl::DataLossError(absl::StrCat("etcd key ", Quoted(key), ": ",
                                            parsed.status().message()));
  }
  if (ReservationKey(prefix, p.pattern()) != key) {
    return absl::DataLossError(absl::StrCat("etcd key ", Quoted(key),
                                            " holds the reservation of ",
                                            Quoted(p.pattern())));
  }
  ReservationEvent out{*std::move(parsed), p.lifted()};
  out.reservation.by = PeerCred{p.uid(), p.gid(), p.pid()};
  out.reservation.at_us = p.at_us();
  return out;
}

std::string AckKey(const std::string& prefix, const TargetKey& key,
                   const std::string& address) {
  return absl::StrCat(prefix, "acks/", PlatformName(key.platform), "/",
                      key.name, "/", address);
}

std::string AckJson(uint32_t generation, int64_t made_at_us,
                    const std::vector<Repointer::Laggard>& laggards,
                    const std::string& error) {
  v1::ClusterAck a;
  a.set_generation(generation);
  a.set_made_at_us(made_at_us);
  for (const Repointer::Laggard& l : laggards) {
    v1::ClusterAck::Laggard* p = a.add_laggards();
    p->set_pid(l.peer.pid);
    p->set_uid(l.peer.uid);
    p->set_local(l.local);
    p->set_generation(static_cast<uint32_t>(l.generation));
    p->set_why(l.why.substr(0, kMaxAckTextBytes));
  }
  a.set_error(error.substr(0, kMaxAckTextBytes));
  return RecordJson(a);
}

absl::StatusOr<AckRecord> ParseSignedAck(
    const RecordSigner& signer, const std::string& prefix, const TargetKey& key,
    const std::string& etcd_key, const std::string& value, RecordPlace at) {
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(
        absl::StrCat("etcd key ", Quoted(etcd_key),
                     " holds no valid acknowledgement: ", why));
  };
  if (value.size() > kMaxAckRecordBytes) {
    return bad(absl::StrCat("its ", value.size(), " bytes are more than ",
                            kMaxAckRecordBytes));
  }
  const std::string under = AckKey(prefix, key, "");
  AckRecord out;
  if (absl::StartsWith(etcd_key, under)) {
    out.address = etcd_key.substr(under.size());
  }
  if (!PeerAddressOk(out.address)) {
    return bad(absl::StrCat("the key is not ", Quoted(under + "HOST:PORT")));
  }
  KREG_ASSIGN_OR_RETURN(SignedRecord r, signer.Verify(etcd_key, value, at));
  if (r.kind != kAckRecord) {
    return bad(absl::StrCat("it is a ", r.kind, " record"));
  }
  v1::ClusterAck a;
  if (!RecordFromJson(r.body, &a)) return bad("its body does not parse");
  auto text_ok = [](const std::string& t) {
    if (t.size() > kMaxAckTextBytes) return false;
    for (char c : t) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return false;
    }
    return true;
  };
  if (a.generation() == 0) return bad("its generation is 0");
  if (!text_ok(a.error())) {
    return bad(absl::StrCat("its error ", Quoted(a.error()), " is longer than ",
                            kMaxAckTextBytes,
                            " bytes or holds control characters"));
  }
  out.generation = a.generation();
  out.made_at_us = a.made_at_us();
  out.error = a.error();
  for (const v1::ClusterAck::Laggard& l : a.laggards()) {
    if (l.pid() == 0 || l.generation() >= a.generation() || !text_ok(l.why())) {
      return bad(absl::StrCat(
          "its laggard pid ", l.pid(), " (generation ", l.generation(),
          ", reason ", Quoted(l.why()),
          ") is not a process that runs an earlier generation than ",
          a.generation(), " with a reason of at most ", kMaxAckTextBytes,
          " printable bytes"));
    }
    Repointer::Laggard g;
    g.peer.uid = l.uid();
    g.peer.pid = static_cast<pid_t>(l.pid());
    g.local = l.local();
    g.generation = l.generation();
    g.why = l.why();
    out.laggards.push_back(std::move(g));
  }
  return out;
}

bool PeerAddressOk(const std::string& address) {
  absl::StatusOr<HostPort> hp = ParseHostPort(address);
  if (!hp.ok()) return false;
  const std::string& host = hp->host;
  if (hp->bracketed) {
    return host.find_first_not_of("0123456789abcdefABCDEF:.") ==
           std::string::npos;
  }
  // gRPC reads "SCHEME:rest" as a target URI when it knows the scheme:
  // "unix:1" would dial the Unix socket "1", not host "unix" port 1.
  const std::string lower = absl::AsciiStrToLower(host);
  for (const char* scheme :
       {"unix", "unix-abstract", "dns", "ipv4", "ipv6", "vsock"}) {
    if (lower == scheme) return false;
  }
  return host.size() <= 253 &&
         host.find_first_not_of(
             "abcdefghijklmnopqrstuvwxyz"
             "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_") == std::string::npos;
}

absl::StatusOr<v1::ClusterHost> ParseHostRecord(const std::string& value) {
  v1::ClusterHost h;
  if (!RecordFromJson(value, &h)) {
    return absl::DataLossError("the host record does not parse as a kregd's");
  }
  if (!PeerAddressOk(h.address())) {
    return absl::DataLossError(absl::StrCat("the host record's address ",
                                            Quoted(h.address()),
                                            " is not HOST:PORT"));
  }
  for (const std::string& d : h.modules()) {
    if (!WellFormedDigest(d)) {
      return absl::DataLossError(absl::StrCat(
          "host ", h.address(), " lists module ", Quoted(d),
          ", which is not \"sha256:\" followed by 64 lowercase hex"));
    }
  }
  return h;
}

std::string HostKey(const std::string& prefix, const std::string& address) {
  return absl::StrCat(prefix, "peers/", address);
}

absl::StatusOr<v1::ClusterHost> ParseSignedHostRecord(
    const RecordSigner& signer, const std::string& prefix,
    const std::string& etcd_key, const std::string& value, RecordPlace at) {
  KREG_ASSIGN_OR_RETURN(SignedRecord r, signer.Verify(etcd_key, value, at));
  if (r.kind != kHostRecord) {
    return absl::DataLossError(absl::StrCat("etcd key ", Quoted(etcd_key),
                                            " holds a ", r.kind,
                                            " record, not a host record"));
  }
  absl::StatusOr<v1::ClusterHost> h = ParseHostRecord(r.body);
  if (!h.ok()) {
    return absl::DataLossError(absl::StrCat("etcd key ", Quoted(etcd_key), ": ",
                                            h.status().message()));
  }
  if (HostKey(prefix, h->address()) != etcd_key) {
    return absl::DataLossError(absl::StrCat("etcd key ", Quoted(etcd_key),
                                            " holds the host record of ",
                                            Quoted(h->address())));
  }
  return h;
}

}  // namespace kreg
