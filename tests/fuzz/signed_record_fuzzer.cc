// Fuzzes the signed records cluster mode reads from etcd (DESIGN §10,
// record_signer.h): whoever can write to etcd sends these bytes.
//
// Input: byte 0 bit 0 clear: the rest is "KEY\0VALUE" (no NUL: the VALUE
// under the binding key of "fuzz.t" on cpu), verified as it is; bit 0 set:
// the rest is a body, signed under that key with the fuzz cluster key as a
// binding (bit 1 clear) or a retirement (bit 1 set), then verified, so that
// the binding checks behind the signature are reached too. Records are
// verified at place {41, 3} (create_revision, version), or, byte 0 bit 2
// set, at the key's first version {41, 1} (where a creating write, signed
// for kCreatingWrite, is a claim not sealed yet); bit 3 set signs a body
// (bit 0) for kCreatingWrite.
// Accepted: exactly the bytes RecordSigner::Sign makes of its kind, place
// and body under that key (no other form passes); refused under any other
// etcd key, cluster key or place (a replay); ParseSignedBinding accepts
// only a binding or retirement whose target's key is the etcd key. Every
// refusal has a message.
#include <cstdint>
#include <string>

#include "daemon/cluster/cluster_records.h"
#include "daemon/cluster/record_signer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using namespace kreg;

const char kPrefix[] = "/kregd/fuzz/";

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kreg::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const RecordSigner signer(std::string(32, 'k'));
  static const RecordSigner other(std::string(32, 'o'));
  const std::string in(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string key = BindingKey(kPrefix, {"fuzz.t", Platform::kCpu});
  const RecordPlace at =
      (data[0] & 4) ? RecordPlace{41, 1} : RecordPlace{41, 3};
  std::string value = in;
  if (data[0] & 1) {
    value = signer.Sign(key, (data[0] & 2) ? kRetireRecord : kBindRecord, in,
                        (data[0] & 8) ? kCreatingWrite : at);
  } else if (const size_t nul = in.find('\0'); nul != std::string::npos) {
    key = in.substr(0, nul);
    value = in.substr(nul + 1);
  }
  absl::StatusOr<SignedRecord> r = signer.Verify(key, value, at);
  absl::StatusOr<BindingRecord> b =
      ParseSignedBinding(signer, kPrefix, key, value, at);
  if (!r.ok()) {
    if (r.status().message().empty()) fuzz::Fail("refusal without a message");
    if (b.ok()) fuzz::Fail("binding accepted without a valid signature");
    // Only a creating write, at a key's first version, is "not sealed".
    if (r.status().code() == absl::StatusCode::kNotFound &&
        (at.version != 1 || value.substr(0, value.find('\n')).find(" 0 1 ") ==
                                std::string::npos)) {
      fuzz::Fail("a claim not sealed yet that is not a creating write");
    }
    return 0;
  }
  if (signer.Sign(key, r->kind, r->body, at) != value) {
    fuzz::Fail("accepted other bytes than Sign makes");
  }
  if (signer.Verify(key + "x", value, at).ok() ||
      other.Verify(key, value, at).ok()) {
    fuzz::Fail("accepted under another etcd key or cluster key");
  }
  // Put back later: the same incarnation's next version, or a new one.
  if (signer.Verify(key, value, {at.create_revision, at.version + 1}).ok() ||
      signer.Verify(key, value, {at.create_revision + 1, at.version}).ok()) {
    fuzz::Fail("accepted a record at another place than it was signed for");
  }
  if (!b.ok()) {
    if (b.status().message().empty()) fuzz::Fail("refusal without a message");
    return 0;
  }
  if (BindingKey(kPrefix, b->entry.key) != key) {
    fuzz::Fail("binding of another target than its key");
  }
  if (b->retired != (r->kind == kRetireRecord) ||
      (r->kind != kBindRecord && r->kind != kRetireRecord)) {
    fuzz::Fail("a record of another kind taken as a binding");
  }
  return 0;
}
