#include "daemon/base/adoption.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/unique_fd.h"
#include "daemon/base/files.h"
#include "daemon/base/sha256.h"

namespace kreg {
namespace {

constexpr size_t kSecretBytes = 32;

void AppendField(std::string* out, const std::string& value) {
  absl::StrAppend(out, value.size(), ":", value, ";");
}

OfferJudgement Refuse(std::string why) {
  return {OfferVerdict::kRefuse, std::move(why)};
}

}  // namespace

absl::StatusOr<std::string> LoadAdoptionSecret(const std::string& state_dir) {
  const std::string path = state_dir + "/executor-adoption.key";
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.ok() && errno == ENOENT) {
    char bytes[kSecretBytes];
    if (::getrandom(bytes, sizeof(bytes), 0) !=
        static_cast<ssize_t>(sizeof(bytes))) {
      return ErrnoError("getrandom for", path);
    }
    if (absl::Status st = WriteFileAtomically(
            path, absl::string_view(bytes, sizeof(bytes)), 0600);
        !st.ok()) {
      return absl::InternalError(absl::StrCat(
          st.message(), " (the state directory must be writable by kregd)"));
    }
    fd = UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  }
  if (!fd.ok()) {
    return ErrnoError("cannot open", path);
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) ||
      st.st_size != static_cast<off_t>(kSecretBytes) ||
      (st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " is not a ", kSecretBytes,
        "-byte regular file readable by its owner only; remove it (kregd "
        "makes a new one; executors left by the kregd before cannot then be "
        "adopted)"));
  }
  std::string secret(kSecretBytes, '\0');
  if (::pread(fd.get(), secret.data(), kSecretBytes, 0) !=
      static_cast<ssize_t>(kSecretBytes)) {
    return ErrnoError("cannot read", path);
  }
  return secret;
}

std::string AdoptionKey(const std::string& secret, const AdoptionIdentity& id) {
  std::string m = "kregd executor adoption 1;";
  AppendField(&m, id.nonce);
  AppendField(&m, absl::StrCat(id.uid));
  AppendField(&m, absl::StrCat(id.gid));
  AppendField(&m, id.group);
  AppendField(&m, absl::StrCat(id.slots));
  AppendField(&m, id.settings_digest);
  return HmacSha256(secret, m);
}

AdoptionIdentity IdentityOf(const v1::ExecReadopt& offer) {
  return {offer.adoption_nonce(), offer.uid(),   offer.gid(),
          offer.group(),          offer.slots(), offer.settings_digest()};
}

std::string KregdProof(const std::string& key, const std::string& challenge) {
  return HmacSha256(key, "kregd supervision 1: kregd;" + challenge);
}

std::string ExecutorProof(const std::string& key,
                          const std::string& challenge) {
  return HmacSha256(key, "kregd supervision 1: executor;" + challenge);
}

bool SameBytes(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

std::string SettingsDigest(const v1::ExecInit& init) {
  v1::ExecInit t = init;
  t.clear_drop_privileges();
  t.clear_uid();
  t.clear_gid();
  t.clear_groups();
  t.clear_group();
  t.clear_parent_pid();
  t.clear_slots();
  t.clear_log_level();
  t.clear_orphan_timeout_s();
  t.clear_supervision_socket();
  t.clear_adoption_nonce();
  t.clear_adoption_key();
  t.clear_settings_digest();
  std::string bytes;
  t.SerializeToString(&bytes);
  return Sha256Digest(bytes);
}

OfferJudgement CheckClaims(const v1::ExecReadopt& offer, const PeerCred& conn,
                           const AdoptionPolicy& policy) {
  if (offer.pid() <= 0 || offer.pid() != conn.pid) {
    return Refuse(absl::StrCat("it claims pid ", offer.pid(),
                               " but the connection is from pid ", conn.pid));
  }
  if (offer.uid() != conn.uid) {
    return Refuse(absl::StrCat("it claims uid ", offer.uid(),
                               " but the connection is from uid ", conn.uid));
  }
  if (offer.slots() == 0 || offer.slots() > policy.max_slots) {
    return Refuse(absl::StrCat("it claims ", offer.slots(),
                               " session slots (1 to ", policy.max_slots,
                               " allowed)"));
  }
  if (offer.sessions() > offer.slots()) {
    return Refuse(absl::StrCat("it offers ", offer.sessions(),
                               " sessions but has only ", offer.slots(),
                               " slots"));
  }
  if (offer.adoption_nonce().size() != kAdoptionNonceBytes) {
    return Refuse(absl::StrCat("its adoption nonce has ",
                               offer.adoption_nonce().size(), " bytes, not ",
                               kAdoptionNonceBytes));
  }
  return {OfferVerdict::kAdopt, ""};
}

OfferJudgement JudgeOffer(const v1::ExecReadopt& offer, const PeerCred& conn,
                          const AdoptionPolicy& policy,
                          const std::string& challenge,
                          const std::string& proof) {
  if (OfferJudgement j = CheckClaims(offer, conn, policy);
      j.verdict != OfferVerdict::kAdopt) {
    return j;
  }
  const std::string key = AdoptionKey(policy.secret, IdentityOf(offer));
  if (!SameBytes(ExecutorProof(key, challenge), proof)) {
    return Refuse(
        "its adoption key does not verify: it was not started by a kregd "
        "with this state directory's executor-adoption.key");
  }
  if (offer.session_protocol_major() != policy.session_protocol_major) {
    return {OfferVerdict::kDrain,
            absl::StrCat("it speaks session protocol ",
                         offer.session_protocol_major(), ".",
                         offer.session_protocol_minor(), " and this kregd ",
                         policy.session_protocol_major, ".x")};
  }
  if (offer.settings_digest() != policy.settings_digest) {
    return {OfferVerdict::kDrain,
            "it was started with other executor settings (limits, seccomp, "
            "launch ring) than this kregd's"};
  }
  return {OfferVerdict::kAdopt, ""};
}

}  // namespace kreg
