// Re-adopting executors an earlier kregd left running (DESIGN §12): the
// secret and the key that prove a kregd of this host started an executor,
// and the judgement of what an executor offers on the supervision socket.
// Everything but LoadAdoptionSecret is a pure function.
#ifndef KREGD_DAEMON_BASE_ADOPTION_H_
#define KREGD_DAEMON_BASE_ADOPTION_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/base/types.h"
#include "kreg/v1/executor.pb.h"

namespace kreg {

// 32 random bytes in <state_dir>/executor-adoption.key (mode 0600), made on
// first use. INTERNAL naming the file when it cannot be read or made;
// FAILED_PRECONDITION when it exists with another size or is readable by
// others than its owner.
absl::StatusOr<std::string> LoadAdoptionSecret(const std::string& state_dir);

// What a key is bound to: who the executor runs as, the group it serves,
// its page's slots and the settings it was started with.
struct AdoptionIdentity {
  std::string nonce;
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::string group;
  uint32_t slots = 0;
  std::string settings_digest;
};
constexpr size_t kAdoptionNonceBytes = 16;

// HMAC-SHA256 under `secret` over `id`, fields length-prefixed.
std::string AdoptionKey(const std::string& secret, const AdoptionIdentity& id);
// What `offer` claims to be.
AdoptionIdentity IdentityOf(const v1::ExecReadopt& offer);

// The supervision handshake (executor.proto): each side proves it holds
// the executor's adoption key by answering the other's random challenge
// (kSupervisionChallengeBytes) with an HMAC-SHA256 under the key, of
// another context for each side, so that neither answer can stand for the
// other and the key itself is never sent.
constexpr size_t kSupervisionChallengeBytes = 32;
std::string KregdProof(const std::string& key, const std::string& challenge);
std::string ExecutorProof(const std::string& key, const std::string& challenge);
// In time independent of where `a` and `b` differ.
bool SameBytes(const std::string& a, const std::string& b);
// A digest of `init` without what differs per executor or does not change
// what a kernel may do (credentials, group, slots, parent, log level,
// orphan_timeout, the adoption fields).
std::string SettingsDigest(const v1::ExecInit& init);

struct AdoptionPolicy {
  std::string secret;
  std::string settings_digest;  // of this kregd's executors
  uint32_t session_protocol_major = 0;
  // Bounds on what an offer may claim, checked before anything is mapped.
  uint32_t max_slots = 1u << 16;
  // The call-site states one offered session may claim (the executors'
  // max_states_per_session; 0: unbounded).
  uint64_t max_states_per_session = 0;
};

enum class OfferVerdict {
  kAdopt,
  // Authentic, but this kregd cannot take it over (another session-protocol
  // major, other settings): it should finish its calls and exit.
  kDrain,
  // Not shown to be an executor of a kregd of this host: ignored.
  kRefuse,
};

struct OfferJudgement {
  OfferVerdict verdict = OfferVerdict::kRefuse;
  std::string why;  // for kDrain and kRefuse: a sentence naming the value
};

// The session-protocol version of the executors this kregd starts and
// re-adopts: its build's (daemon/base/protocol_version.h). Weak
// definitions: the upgrade tests link kregd binaries that report another
// (//daemon/kregd:kregd_next_minor, //daemon/kregd:kregd_next_major).
uint32_t AdoptableProtocolMajor();
uint32_t AdoptableProtocolMinor();

// What JudgeOffer checks before the key: the claims of `offer` that its
// connection's SO_PEERCRED `conn` and the bounds refute (kRefuse), else
// kAdopt. kregd answers an executor's challenge only for an offer that
// passes, so it proves no key but those of the connecting uid's executors.
OfferJudgement CheckClaims(const v1::ExecReadopt& offer, const PeerCred& conn,
                           const AdoptionPolicy& policy);
// Judges `offer`, which came over a connection whose SO_PEERCRED is
// `conn`, with `proof`: ExecutorProof under its key of `challenge`, the
// one kregd sent it.
OfferJudgement JudgeOffer(const v1::ExecReadopt& offer, const PeerCred& conn,
                          const AdoptionPolicy& policy,
                          const std::string& challenge,
                          const std::string& proof);

}  // namespace kreg

#endif  // KREGD_DAEMON_BASE_ADOPTION_H_
