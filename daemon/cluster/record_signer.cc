#include "daemon/cluster/record_signer.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/unique_fd.h"
#include "daemon/base/files.h"
#include "daemon/base/sha256.h"

namespace kreg {
namespace {

constexpr char kMagic[] = "kreg-sig-v2 ";
constexpr char kOldMagic[] = "kreg-sig-v1 ";

std::string KeyText(const std::string& etcd_key) {
  return absl::StrCat("\"", absl::CHexEscape(etcd_key.substr(0, 200)), "\"");
}

// A place number as Sign writes it: decimal, no sign, no leading zero.
bool ParsePlaceNumber(absl::string_view text, int64_t* out) {
  return !text.empty() && text.size() <= 19 &&
         text.find_first_not_of("0123456789") == absl::string_view::npos &&
         (text == "0" || text[0] != '0') && absl::SimpleAtoi(text, out);
}

std::string PlaceText(RecordPlace at) {
  return absl::StrCat("version ", at.version,
                      " of the key as created at "
                      "revision ",
                      at.create_revision);
}

}  // namespace

std::string RecordSigner::Mac(const std::string& etcd_key,
                              const std::string& kind, RecordPlace at,
                              const std::string& body) const {
  // Kind (no newline), the place and the key's length delimit the fields:
  // no two (kind, place, key, body) sign the same bytes.
  const std::string data =
      absl::StrCat(kMagic, kind, "\n", at.create_revision, "\n", at.version,
                   "\n", etcd_key.size(), "\n", etcd_key, body);
  return absl::BytesToHexString(HmacSha256(key_, data));
}

std::string RecordSigner::Sign(const std::string& etcd_key,
                               const std::string& kind, const std::string& body,
                               RecordPlace at) const {
  return absl::StrCat(kMagic, kind, " ", at.create_revision, " ", at.version,
                      " ", Mac(etcd_key, kind, at, body), "\n", body);
}

absl::StatusOr<SignedRecord> RecordSigner::Verify(const std::string& etcd_key,
                                                  const std::string& value,
                                                  RecordPlace at) const {
  if (value.compare(0, sizeof(kOldMagic) - 1, kOldMagic) == 0) {
    return absl::UnauthenticatedError(absl::StrCat(
        "etcd key ", KeyText(etcd_key),
        " holds a record of the earlier format kreg-sig-v1, which is not "
        "bound to its place in the key's history (it could be a replay); "
        "kregd reads only kreg-sig-v2. Upgrade every host of the cluster, "
        "then register the target again (or lift/reserve the name again)"));
  }
  const size_t nl = value.find('\n');
  std::vector<absl::string_view> head;
  if (nl != std::string::npos) {
    head = absl::StrSplit(absl::string_view(value).substr(0, nl), ' ');
  }
  RecordPlace signed_at;
  if (value.compare(0, sizeof(kMagic) - 1, kMagic) != 0 || head.size() != 5 ||
      !ParsePlaceNumber(head[2], &signed_at.create_revision) ||
      !ParsePlaceNumber(head[3], &signed_at.version)) {
    return absl::UnauthenticatedError(absl::StrCat(
        "etcd key ", KeyText(etcd_key),
        " holds a record without a kregd signature (not written by a kregd "
        "of this cluster)"));
  }
  SignedRecord r;
  r.kind = std::string(head[1]);
  const absl::string_view mac = head[4];
  r.body = value.substr(nl + 1);
  if (r.kind != kBindRecord && r.kind != kRetireRecord &&
      r.kind != kCompiledRecord && r.kind != kReserveRecord &&
      r.kind != kAckRecord && r.kind != kHostRecord) {
    return absl::UnauthenticatedError(absl::StrCat(
        "etcd key ", KeyText(etcd_key), " holds a record of unknown kind \"",
        absl::CHexEscape(r.kind.substr(0, 40)), "\""));
  }
  const std::string want = Mac(etcd_key, r.kind, signed_at, r.body);
  if (mac.size() != want.size() ||
      CRYPTO_memcmp(mac.data(), want.data(), want.size()) != 0) {
    return absl::UnauthenticatedError(absl::StrCat(
        "etcd key ", KeyText(etcd_key),
        " holds a record with a bad signature (altered, moved from another "
        "key, or signed with another cluster key than this kregd's "
        "cluster_key_file)"));
  }
  if (signed_at == kCreatingWrite && at.version == 1) {
    return absl::NotFoundError(absl::StrCat(
        "etcd key ", KeyText(etcd_key), " holds a ", r.kind,
        " record not sealed yet (its writer seals it next; one that is "
        "never sealed counts for nothing)"));
  }
  if (!(signed_at == at)) {
    return absl::UnauthenticatedError(absl::StrCat(
        "etcd key ", KeyText(etcd_key), " holds a replayed ", r.kind,
        " record: it was signed for ", PlaceText(signed_at),
        ", but the key is at ", PlaceText(at),
        ", so it is an earlier record put back by someone who can write to "
        "etcd (without the cluster key). Restrict write access to the "
        "cluster's etcd prefix to kregd's etcd user (etcd auth)"));
  }
  return r;
}

absl::StatusOr<std::string> ReadClusterKey(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st {};
  if (!fd.ok() || ::fstat(fd.get(), &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read the cluster key file \"", path,
                     "\" (cluster_key_file): ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode) || st.st_size > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("the cluster key file \"", path,
                     "\" (cluster_key_file) is not a regular file of at most "
                     "4096 bytes"));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the cluster key file \"%s\" (cluster_key_file) has mode %04o: "
        "group or others can read or write it, and whoever reads it can "
        "forge cluster bindings; chmod 600 it (owned by kregd's user)",
        path, st.st_mode & 07777));
  }
  std::string key;
  if (absl::Status got = ReadAll(fd.get(), &key, 4096, path); !got.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster_key_file: ", got.message()));
  }
  absl::StripTrailingAsciiWhitespace(&key);
  if (key.size() < RecordSigner::kMinKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the cluster key file \"", path, "\" (cluster_key_file) holds ",
        key.size(), " bytes; a cluster key needs at least ",
        RecordSigner::kMinKeyBytes,
        " (make one with: openssl rand -hex 32 > FILE; chmod 600 FILE, and "
        "give every host of the cluster the same file)"));
  }
  return key;
}

}  // namespace kreg
