// Fuzzes what cluster mode takes from other hosts (DESIGN §10): the values
// read from etcd (binding, host and reservation records: cluster_records.h)
// and the module chunks a peer streams (ModuleAssembler, module_exchange.h).
//
// Input: byte 0 % 5 picks the decoder, the rest is its input.
// 0: binding record. "KEY\0VALUE" (no NUL: the value under the key of
//    "fuzz.t" on cpu) into ParseBindingRecord. Accepted: the name is valid,
//    the key is the binding's own, and the binding re-encoded (RecordJson)
//    parses back to the same fields (its generations too).
// 1: host record. "KEY\0BODY" (no NUL: under the key of host
//    10.0.0.2:7000), the body signed as for 3, into ParseSignedHostRecord.
//    Accepted: PeerAddressOk, the key is the host's own, every module
//    digest well formed, and the record round-trips.
// 2: chunk stream. Byte 0 bit 0: announce the right total size; bit 1: the
//    expected digest is that of all chunk data (else of "other"); bytes 1-2
//    (LE): the expected size when bit 2 is clear (else the data's length);
//    then chunks, each a length byte and that many bytes. Fed to one
//    ModuleAssembler: it never holds more than the size; once it refused it
//    keeps refusing; Finish succeeds only with exactly the size and digest.
// 3: reservation record. "KEY\0BODY" (no NUL: under the key of "fuzz.*"),
//    the body signed with the fuzzer's cluster key (so that the body, not
//    the MAC, is what varies) at place {9, 2} into ParseSignedReservation
//    (every signed record below too; a record at another place is refused
//    as a replay: checked for each accepted one). Accepted: the
//    pattern is one `kregctl reserve` takes, the key is its own, and the
//    record re-encoded (ReservationJson) parses back to the same fields.
// 4: acknowledgement record. "KEY\0BODY" (no NUL: under the key of host
//    10.0.0.2:7000 for "fuzz.t" on cpu), the body signed as for 3, into
//    ParseSignedAck. Accepted: the key is the host's of "fuzz.t", the texts
//    are bounded and printable, every laggard runs an earlier generation,
//    and the record re-encoded (AckJson) parses back to the same fields.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "daemon/base/validate.h"
#include "daemon/cluster/cluster_records.h"
#include "daemon/cluster/module_exchange.h"
#include "daemon/registry/target_proto.h"
#include "daemon/store/module_store.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using namespace kreg;

const char kPrefix[] = "/kregd/fuzz/";
// Where the records are read: the key's 2nd write since its creation at 9.
constexpr RecordPlace kAt{9, 2};
constexpr RecordPlace kLater{9, 3};

const RecordSigner& Signer() {
  static const RecordSigner* const signer =
      new RecordSigner(std::string(32, 'k'));
  return *signer;
}

void Binding(const std::string& in) {
  std::string key, value;
  const size_t nul = in.find('\0');
  if (nul == std::string::npos) {
    key = BindingKey(kPrefix, {"fuzz.t", Platform::kCpu});
    value = in;
  } else {
    key = in.substr(0, nul);
    value = in.substr(nul + 1);
  }
  absl::StatusOr<TargetEntry> e = ParseBindingRecord(kPrefix, key, value);
  if (!e.ok()) {
    if (e.status().message().empty()) fuzz::Fail("refusal without a message");
    return;
  }
  if (!ValidateTargetName(e->key.name).ok()) {
    fuzz::Fail("accepted an invalid target name");
  }
  if (BindingKey(kPrefix, e->key) != key) fuzz::Fail("key of another target");
  absl::StatusOr<TargetEntry> again =
      ParseBindingRecord(kPrefix, key, RecordJson(ToProto(*e)));
  if (!again.ok()) {
    fuzz::Fail("re-encoded binding refused: " +
               std::string(again.status().message()));
  }
  if (!(again->key == e->key) || again->kind != e->kind ||
      again->func_name != e->func_name || again->content_id != e->content_id ||
      again->module_digest != e->module_digest ||
      again->module_size != e->module_size ||
      again->generation != e->generation ||
      again->generations.size() != e->generations.size()) {
    fuzz::Fail("binding changed in a round trip");
  }
}

void Host(const std::string& in) {
  const RecordSigner& signer = Signer();
  std::string key, body;
  const size_t nul = in.find('\0');
  if (nul == std::string::npos) {
    key = HostKey(kPrefix, "10.0.0.2:7000");
    body = in;
  } else {
    key = in.substr(0, nul);
    body = in.substr(nul + 1);
  }
  const std::string value = signer.Sign(key, kHostRecord, body, kAt);
  absl::StatusOr<v1::ClusterHost> h =
      ParseSignedHostRecord(signer, kPrefix, key, value, kAt);
  if (!h.ok()) {
    if (h.status().message().empty()) fuzz::Fail("refusal without a message");
    return;
  }
  if (!PeerAddressOk(h->address())) fuzz::Fail("accepted a bad address");
  if (h->address().find('/') != std::string::npos ||
      h->address().rfind("unix:", 0) == 0) {
    fuzz::Fail("accepted a non-TCP address: " + h->address());
  }
  for (const std::string& d : h->modules()) {
    if (!WellFormedDigest(d)) fuzz::Fail("accepted a malformed digest");
  }
  if (HostKey(kPrefix, h->address()) != key) {
    fuzz::Fail("accepted the record of another host than its key");
  }
  if (ParseSignedHostRecord(signer, kPrefix, key, value, kLater).ok()) {
    fuzz::Fail("accepted a host record put back");
  }
  absl::StatusOr<v1::ClusterHost> again = ParseSignedHostRecord(
      signer, kPrefix, key, signer.Sign(key, kHostRecord, RecordJson(*h), kAt),
      kAt);
  if (!again.ok() || again->address() != h->address() ||
      again->modules_size() != h->modules_size()) {
    fuzz::Fail("host record changed in a round trip");
  }
}

void Reservation(const std::string& in) {
  const RecordSigner* const signer = &Signer();
  std::string key, body;
  const size_t nul = in.find('\0');
  if (nul == std::string::npos) {
    key = ReservationKey(kPrefix, "fuzz.*");
    body = in;
  } else {
    key = in.substr(0, nul);
    body = in.substr(nul + 1);
  }
  const std::string value = signer->Sign(key, kReserveRecord, body, kAt);
  absl::StatusOr<ReservationEvent> r =
      ParseSignedReservation(*signer, kPrefix, key, value, kAt);
  if (!r.ok()) {
    if (r.status().message().empty()) fuzz::Fail("refusal without a message");
    return;
  }
  if (ParseSignedReservation(*signer, kPrefix, key, value, kLater).ok()) {
    fuzz::Fail("accepted a reservation or lifting put back");
  }
  const NameReservation& got = r->reservation;
  if (!ParseReservation(got.pattern, "0").ok()) {
    fuzz::Fail("accepted a pattern kregctl reserve refuses");
  }
  if (ReservationKey(kPrefix, got.pattern) != key) {
    fuzz::Fail("key of another pattern");
  }
  absl::StatusOr<ReservationEvent> again = ParseSignedReservation(
      *signer, kPrefix, key,
      signer->Sign(key, kReserveRecord, ReservationJson(got, r->lifted), kAt),
      kAt);
  if (!again.ok() || again->lifted != r->lifted ||
      again->reservation.pattern != got.pattern ||
      again->reservation.owner != got.owner ||
      again->reservation.group != got.group ||
      again->reservation.at_us != got.at_us) {
    fuzz::Fail("reservation changed in a round trip");
  }
}

void Ack(const std::string& in) {
  const RecordSigner* const signer = &Signer();
  const TargetKey target{"fuzz.t", Platform::kCpu};
  std::string key, body;
  const size_t nul = in.find('\0');
  if (nul == std::string::npos) {
    key = AckKey(kPrefix, target, "10.0.0.2:7000");
    body = in;
  } else {
    key = in.substr(0, nul);
    body = in.substr(nul + 1);
  }
  const std::string value = signer->Sign(key, kAckRecord, body, kAt);
  absl::StatusOr<AckRecord> a =
      ParseSignedAck(*signer, kPrefix, target, key, value, kAt);
  if (!a.ok()) {
    if (a.status().message().empty()) fuzz::Fail("refusal without a message");
    return;
  }
  if (ParseSignedAck(*signer, kPrefix, target, key, value, kLater).ok()) {
    fuzz::Fail("accepted an acknowledgement put back");
  }
  if (!PeerAddressOk(a->address) ||
      AckKey(kPrefix, target, a->address) != key) {
    fuzz::Fail("accepted the key of another host or target");
  }
  if (a->generation == 0 || a->error.size() > kMaxAckTextBytes) {
    fuzz::Fail("accepted generation 0 or a long error");
  }
  for (const Repointer::Laggard& l : a->laggards) {
    if (l.peer.pid == 0 || l.generation >= a->generation ||
        l.why.size() > kMaxAckTextBytes) {
      fuzz::Fail("accepted a bad laggard");
    }
  }
  absl::StatusOr<AckRecord> again = ParseSignedAck(
      *signer, kPrefix, target, key,
      signer->Sign(key, kAckRecord,
                   AckJson(a->generation, a->made_at_us, a->laggards, a->error),
                   kAt),
      kAt);
  if (!again.ok() || again->generation != a->generation ||
      again->made_at_us != a->made_at_us || again->error != a->error ||
      again->laggards.size() != a->laggards.size()) {
    fuzz::Fail("acknowledgement changed in a round trip");
  }
}

void Chunks(const std::string& in) {
  if (in.size() < 3) return;
  const uint8_t flags = static_cast<uint8_t>(in[0]);
  std::vector<std::string> chunks;
  std::string all;
  for (size_t pos = 3; pos < in.size();) {
    const size_t n = static_cast<uint8_t>(in[pos++]);
    chunks.push_back(in.substr(pos, n));
    all += chunks.back();
    pos += n;
  }
  const uint64_t size =
      (flags & 4) ? all.size()
                  : static_cast<uint64_t>(static_cast<uint8_t>(in[1])) |
                        static_cast<uint64_t>(static_cast<uint8_t>(in[2])) << 8;
  const std::string digest = Sha256Digest((flags & 2) ? all : "other");
  ModuleAssembler module("peer:1", digest, size);
  bool refused = false;
  for (size_t i = 0; i < chunks.size(); ++i) {
    v1::ModuleChunk c;
    c.set_data(chunks[i]);
    if (i == 0) c.set_total_size((flags & 1) ? size : size + 1);
    absl::Status s = module.Add(c);
    if (refused && s.ok()) fuzz::Fail("accepted a chunk after a refusal");
    if (!s.ok()) {
      if (s.code() != absl::StatusCode::kDataLoss) fuzz::Fail("not DATA_LOSS");
      refused = true;
    }
    if (module.held() > size) fuzz::Fail("holds more than the size");
  }
  absl::StatusOr<std::string> got = module.Finish();
  if (got.ok()) {
    if (refused) fuzz::Fail("finished after a refusal");
    if (got->size() != size || Sha256Digest(*got) != digest) {
      fuzz::Fail("finished with other bytes than announced");
    }
    if (*got != all) fuzz::Fail("finished with bytes that were not sent");
  } else if (got.status().code() != absl::StatusCode::kDataLoss) {
    fuzz::Fail("Finish refused with another code than DATA_LOSS");
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kreg::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string in(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 5) {
    case 0:
      Binding(in);
      break;
    case 1:
      Host(in);
      break;
    case 2:
      Chunks(in);
      break;
    case 3:
      Reservation(in);
      break;
    default:
      Ack(in);
  }
  return 0;
}
