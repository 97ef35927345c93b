#include "daemon/cluster/record_signer.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/unique_fd.h"
#include "daemon/base/files.h"
#include "daemon/base/sha256.h"

namespace kreg {
namespace {

constexpr char kMagic[] = "kreg-sig-v1 ";

std::string KeyText(const std::string& etcd_key) {
  return absl::StrCat("\"", absl::CHexEscape(etcd_key.substr(0, 200)), "\"");
}

}  // namespace

std::string RecordSigner::Mac(const std::string& etcd_key,
                              const std::string& kind,
                              const std::string& body) const {
  // Kind (no newline) and the key's length delimit the fields: no two
  // (kind, key, body) sign the same bytes.
  const std::string data =
      absl::StrCat(kMagic, kind, "\n", etcd_key.size(), "\n", etcd_key, body);
  return absl::BytesToHexString(HmacSha256(key_, data));
}

std::string RecordSigner::Sign(const std::string& etcd_key,
                               const std::string& kind,
                               const std::string& body) const {
  return absl::StrCat(kMagic, kind, " ", Mac(etcd_key, kind, body), "\n", body);
}

absl::StatusOr<SignedRecord> RecordSigner::Verify(
    const std::string& etcd_key, const std::string& value) const {
  const size_t nl = value.find('\n');
  const size_t space = value.find(' ', sizeof(kMagic) - 1);
  if (value.compare(0, sizeof(kMagic) - 1, kMagic) != 0 ||
      nl == std::string::npos || space == std::string::npos || space > nl) {
    return absl::UnauthenticatedError(absl::StrCat(
        "etcd key ", KeyText(etcd_key),
        " holds a record without a kregd signature (not written by a kregd "
        "of this cluster)"));
  }
  SignedRecord r;
  r.kind = value.substr(sizeof(kMagic) - 1, space - (sizeof(kMagic) - 1));
  const std::string mac = value.substr(space + 1, nl - space - 1);
  r.body = value.substr(nl + 1);
  if (r.kind != kBindRecord && r.kind != kRetireRecord &&
      r.kind != kCompiledRecord && r.kind != kReserveRecord &&
      r.kind != kAckRecord) {
    return absl::UnauthenticatedError(absl::StrCat(
        "etcd key ", KeyText(etcd_key), " holds a record of unknown kind \"",
        absl::CHexEscape(r.kind.substr(0, 40)), "\""));
  }
  const std::string want = Mac(etcd_key, r.kind, r.body);
  if (mac.size() != want.size() ||
      CRYPTO_memcmp(mac.data(), want.data(), want.size()) != 0) {
    return absl::UnauthenticatedError(absl::StrCat(
        "etcd key ", KeyText(etcd_key),
        " holds a record with a bad signature (altered, moved from another "
        "key, or signed with another cluster key than this kregd's "
        "cluster_key_file)"));
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
