// Re-adoption's checks (DESIGN §12): what an executor offers on the
// supervision socket is believed only once it is shown authentic.
#include "daemon/base/adoption.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "catch2/catch.hpp"
#include "common/wire.h"
#include "daemon/base/status_page.h"
#include "daemon/supervisor/readopt_listener.h"
#include "tests/testing/temp_dir.h"

namespace kreg {
namespace {

constexpr char kSecret[] = "0123456789abcdef0123456789abcdef";

AdoptionPolicy Policy() {
  AdoptionPolicy p;
  p.secret = kSecret;
  p.settings_digest = "sha256:settings";
  p.session_protocol_major = 1;
  return p;
}

const std::string kChallenge(kSupervisionChallengeBytes, 'c');

// An authentic offer of pid 42, uid 1000 (its key is proven by Proof, not
// sent).
v1::ExecReadopt Offer() {
  v1::ExecReadopt m;
  m.set_pid(42);
  m.set_uid(1000);
  m.set_gid(100);
  m.set_group("uid 1000");
  m.set_slots(8);
  m.set_adoption_nonce(std::string(kAdoptionNonceBytes, 'n'));
  m.set_settings_digest("sha256:settings");
  m.set_session_protocol_major(1);
  m.set_session_protocol_minor(8);
  m.set_challenge(std::string(kSupervisionChallengeBytes, 'e'));
  return m;
}

// The key kregd gave the executor of Offer().
std::string Key() {
  AdoptionIdentity id{std::string(kAdoptionNonceBytes, 'n'),
                      1000,
                      100,
                      "uid 1000",
                      8,
                      "sha256:settings"};
  return AdoptionKey(kSecret, id);
}

// `m` judged with the executor's answer to kChallenge (by default that of
// Offer()'s executor, which knows its key).
OfferJudgement Judge(const v1::ExecReadopt& m, const PeerCred& conn,
                     const AdoptionPolicy& policy,
                     const std::string& proof = ExecutorProof(Key(),
                                                              kChallenge)) {
  return JudgeOffer(m, conn, policy, kChallenge, proof);
}

PeerCred Conn(pid_t pid = 42, uid_t uid = 1000) {
  PeerCred c;
  c.pid = pid;
  c.uid = uid;
  c.gid = 100;
  return c;
}

TEST_CASE("An authentic offer from its own process is adopted", "[adoption]") {
  OfferJudgement j = Judge(Offer(), Conn(), Policy());
  CHECK(j.verdict == OfferVerdict::kAdopt);
  // kregd answers its challenge only then (and for nobody else's uid).
  CHECK(CheckClaims(Offer(), Conn(), Policy()).verdict == OfferVerdict::kAdopt);
  j = CheckClaims(Offer(), Conn(42, 1001), Policy());
  CHECK(j.verdict == OfferVerdict::kRefuse);
  CHECK(j.why == "it claims uid 1000 but the connection is from uid 1001");
  CHECK(IdentityOf(Offer()).group == "uid 1000");
  CHECK(AdoptionKey(kSecret, IdentityOf(Offer())) == Key());
}

TEST_CASE("Each side's proof is its own and never the key", "[adoption]") {
  const std::string k = KregdProof(Key(), kChallenge);
  const std::string e = ExecutorProof(Key(), kChallenge);
  CHECK(k.size() == 32);
  CHECK(e.size() == 32);
  // kregd answering an executor's challenge proves nothing in the
  // executor's name (and the other way round), nor discloses the key.
  CHECK(k != e);
  CHECK(k != Key());
  CHECK(e != Key());
  CHECK(KregdProof(Key(), std::string(32, 'd')) != k);
  CHECK(KregdProof(std::string(32, 'x'), kChallenge) != k);
  CHECK(SameBytes(k, KregdProof(Key(), kChallenge)));
  CHECK_FALSE(SameBytes(k, e));
  CHECK_FALSE(SameBytes(k, k.substr(1)));
  // A replayed answer to another challenge does not verify.
  CHECK(Judge(Offer(), Conn(), Policy(),
              ExecutorProof(Key(), std::string(32, 'd')))
            .verdict == OfferVerdict::kRefuse);
  // Nor does the key itself in place of the answer.
  CHECK(Judge(Offer(), Conn(), Policy(), Key()).verdict ==
        OfferVerdict::kRefuse);
}

TEST_CASE("Offers that do not prove themselves are refused", "[adoption]") {
  struct Case {
    const char* what;
    std::function<void(v1::ExecReadopt*)> change;
    PeerCred conn;
    const char* says;
    std::string proof = ExecutorProof(Key(), kChallenge);
  };
  const std::vector<Case> cases = {
      {"another process's pid", [](v1::ExecReadopt*) {}, Conn(43),
       "claims pid 42 but the connection is from pid 43"},
      {"another uid", [](v1::ExecReadopt*) {}, Conn(42, 0),
       "claims uid 1000 but the connection is from uid 0"},
      // The key binds what the executor runs as and serves.
      {"a claimed group", [](v1::ExecReadopt* m) { m->set_group("shared"); },
       Conn(), "adoption key does not verify"},
      {"a claimed gid", [](v1::ExecReadopt* m) { m->set_gid(0); }, Conn(),
       "adoption key does not verify"},
      {"a claimed slot count", [](v1::ExecReadopt* m) { m->set_slots(9); },
       Conn(), "adoption key does not verify"},
      {"another nonce",
       [](v1::ExecReadopt* m) {
         m->set_adoption_nonce(std::string(kAdoptionNonceBytes, 'm'));
       },
       Conn(), "adoption key does not verify"},
      {"a short proof", [](v1::ExecReadopt*) {}, Conn(),
       "adoption key does not verify", "k"},
      {"a short nonce", [](v1::ExecReadopt* m) { m->set_adoption_nonce("n"); },
       Conn(), "adoption nonce has 1 bytes, not 16"},
      {"no slots", [](v1::ExecReadopt* m) { m->set_slots(0); }, Conn(),
       "claims 0 session slots (1 to 65536 allowed)"},
      {"too many slots", [](v1::ExecReadopt* m) { m->set_slots(1u << 20); },
       Conn(), "claims 1048576 session slots"},
      {"more sessions than slots",
       [](v1::ExecReadopt* m) { m->set_sessions(9); }, Conn(),
       "offers 9 sessions but has only 8 slots"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    v1::ExecReadopt m = Offer();
    c.change(&m);
    OfferJudgement j = Judge(m, c.conn, Policy(), c.proof);
    CHECK(j.verdict == OfferVerdict::kRefuse);
    CHECK(j.why.find(c.says) != std::string::npos);
  }
}

TEST_CASE("Another secret refuses every offer", "[adoption]") {
  AdoptionPolicy p = Policy();
  p.secret = std::string(32, 'x');
  CHECK(Judge(Offer(), Conn(), p).verdict == OfferVerdict::kRefuse);
}

TEST_CASE("Authentic offers this kregd cannot take over are drained",
          "[adoption]") {
  AdoptionPolicy p = Policy();
  p.session_protocol_major = 2;
  OfferJudgement j = Judge(Offer(), Conn(), p);
  CHECK(j.verdict == OfferVerdict::kDrain);
  CHECK(j.why == "it speaks session protocol 1.8 and this kregd 2.x");
  // A newer minor is adopted.
  v1::ExecReadopt newer = Offer();
  newer.set_session_protocol_minor(9);
  CHECK(Judge(newer, Conn(), Policy()).verdict == OfferVerdict::kAdopt);
  p = Policy();
  p.settings_digest = "sha256:other";
  j = Judge(Offer(), Conn(), p);
  CHECK(j.verdict == OfferVerdict::kDrain);
  CHECK(j.why.find("other executor settings") != std::string::npos);
}

TEST_CASE("The settings digest ignores what differs per executor",
          "[adoption]") {
  v1::ExecInit a;
  a.set_max_arena_bytes(1 << 20);
  a.set_seccomp(true);
  v1::ExecInit b = a;
  b.set_uid(7);
  b.set_group("uid 7");
  b.set_slots(3);
  b.set_log_level("debug");
  b.set_orphan_timeout_s(9);
  b.set_adoption_key("k");
  CHECK(SettingsDigest(a) == SettingsDigest(b));
  b.set_seccomp(false);
  CHECK(SettingsDigest(a) != SettingsDigest(b));
}

TEST_CASE("The adoption secret is made once and kept private", "[adoption]") {
  testing::TempDir dir;
  absl::StatusOr<std::string> first = LoadAdoptionSecret(dir.path());
  REQUIRE(first.ok());
  CHECK(first->size() == 32);
  const std::string path = dir.path() + "/executor-adoption.key";
  struct stat st;
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  absl::StatusOr<std::string> again = LoadAdoptionSecret(dir.path());
  REQUIRE(again.ok());
  CHECK(*again == *first);

  REQUIRE(::chmod(path.c_str(), 0644) == 0);
  absl::StatusOr<std::string> readable = LoadAdoptionSecret(dir.path());
  CHECK(readable.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(readable.status().message()).find(path) !=
        std::string::npos);

  REQUIRE(::chmod(path.c_str(), 0600) == 0);
  { std::ofstream(path, std::ios::app) << "more"; }
  CHECK(LoadAdoptionSecret(dir.path()).status().code() ==
        absl::StatusCode::kFailedPrecondition);

  CHECK(LoadAdoptionSecret(dir.path() + "/missing").status().code() ==
        absl::StatusCode::kInternal);
}

// The executor's side of a connection: sends frames with descriptors.
void Send(int fd, const google::protobuf::MessageLite& m,
          std::vector<int> fds) {
  std::string out;
  m.SerializeToString(&out);
  REQUIRE(wire::SendFrame(fd, out.data(), out.size(), fds.data(),
                          static_cast<int>(fds.size())) == wire::kOk);
}

struct Pair {
  Pair() {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    a = UniqueFd(sv[0]);
    b = UniqueFd(sv[1]);
  }
  UniqueFd a, b;
};

absl::StatusOr<ReadoptOffer> Read(Pair& conn, uint32_t sessions,
                                  std::vector<UniqueFd> page,
                                  uint64_t max_states = 0) {
  v1::ExecReadopt h = Offer();
  h.set_sessions(sessions);
  h.set_slots(2);
  return ReadOfferSessions(
      conn.b.get(), h, std::move(page),
      std::chrono::steady_clock::now() + std::chrono::milliseconds(500),
      max_states);
}

std::vector<UniqueFd> PageFds() {
  absl::StatusOr<StatusPage> page = StatusPage::Create(2);
  std::vector<UniqueFd> fds;
  fds.emplace_back(::dup(page->fd()));
  return fds;
}

TEST_CASE("Offered sessions are read within bounds and checked", "[adoption]") {
  Pair conn;
  Pair client;
  Pair broker;
  v1::ExecReadoptSession s;
  s.set_slot(1);
  v1::ResolvedToken* t = s.add_tokens();
  t->set_name("a.target");
  t->set_platform("cpu");
  t->set_token(3);

  SECTION("a good session") {
    Send(conn.a.get(), s, {client.a.get(), broker.a.get()});
    absl::StatusOr<ReadoptOffer> offer = Read(conn, 1, PageFds());
    REQUIRE(offer.ok());
    REQUIRE(offer->sessions.size() == 1);
    CHECK(offer->sessions[0].slot == 1);
    CHECK(offer->sessions[0].peer.pid == ::getpid());
    CHECK(offer->sessions[0].tokens[0].first.name == "a.target");
    CHECK(offer->sessions[0].tokens[0].second == 3);
  }
  SECTION("the session's call-site states, within max_states_per_session") {
    s.set_states(4);
    Send(conn.a.get(), s, {client.a.get(), broker.a.get()});
    absl::StatusOr<ReadoptOffer> offer = Read(conn, 1, PageFds(), 4);
    REQUIRE(offer.ok());
    CHECK(offer->sessions[0].states == 4);
  }
  SECTION("more call-site states than max_states_per_session") {
    s.set_states(5);
    Send(conn.a.get(), s, {client.a.get(), broker.a.get()});
    absl::StatusOr<ReadoptOffer> offer = Read(conn, 1, PageFds(), 4);
    CHECK(offer.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(offer.status().message()) ==
          "offered session 0 claims 5 call-site states, more than "
          "max_states_per_session (4)");
  }
  SECTION("no page") {
    absl::StatusOr<ReadoptOffer> offer = Read(conn, 0, {});
    CHECK(std::string(offer.status().message()).find("not one") !=
          std::string::npos);
  }
  SECTION("an unsealed page") {
    absl::StatusOr<StatusPage> page = StatusPage::Create(2);
    std::vector<UniqueFd> fds;
    fds.emplace_back(::memfd_create("x", MFD_CLOEXEC));
    REQUIRE(::ftruncate(fds[0].get(), 1 << 20) == 0);
    absl::StatusOr<ReadoptOffer> offer = Read(conn, 0, std::move(fds));
    CHECK(std::string(offer.status().message()).find("sealed") !=
          std::string::npos);
  }
  SECTION("a slot out of range") {
    s.set_slot(2);
    Send(conn.a.get(), s, {client.a.get(), broker.a.get()});
    absl::StatusOr<ReadoptOffer> offer = Read(conn, 1, PageFds());
    CHECK(std::string(offer.status().message()).find("claims slot 2") !=
          std::string::npos);
  }
  SECTION("two sessions in one slot") {
    Send(conn.a.get(), s, {client.a.get(), broker.a.get()});
    Send(conn.a.get(), s, {client.a.get(), broker.a.get()});
    absl::StatusOr<ReadoptOffer> offer = Read(conn, 2, PageFds());
    CHECK(std::string(offer.status().message()).find("claimed twice") !=
          std::string::npos);
  }
  SECTION("a file where the client's socket belongs") {
    UniqueFd file(::memfd_create("not-a-socket", MFD_CLOEXEC));
    Send(conn.a.get(), s, {file.get(), broker.a.get()});
    absl::StatusOr<ReadoptOffer> offer = Read(conn, 1, PageFds());
    CHECK(std::string(offer.status().message())
              .find("exactly two Unix stream sockets") != std::string::npos);
  }
  SECTION("a bad target name") {
    t->set_name("");
    Send(conn.a.get(), s, {client.a.get(), broker.a.get()});
    absl::StatusOr<ReadoptOffer> offer = Read(conn, 1, PageFds());
    CHECK(std::string(offer.status().message()).find("bad target") !=
          std::string::npos);
  }
  SECTION("a bad platform") {
    t->set_platform("tpu");
    Send(conn.a.get(), s, {client.a.get(), broker.a.get()});
    absl::StatusOr<ReadoptOffer> offer = Read(conn, 1, PageFds());
    CHECK(std::string(offer.status().message()).find("bad target") !=
          std::string::npos);
  }
  SECTION("a session that never comes") {
    absl::StatusOr<ReadoptOffer> offer = Read(conn, 1, PageFds());
    CHECK(offer.status().code() == absl::StatusCode::kDeadlineExceeded);
  }
}

}  // namespace
}  // namespace kreg
