// Fuzzes the supervision socket (readopt_listener.cc, DESIGN §12), where
// any local process may connect and claim to be an executor an earlier
// kregd left running: the first frame parsed as an ExecReadopt and judged
// (JudgeOffer) as coming from the pid and uid it claims, under a secret the
// input cannot know, with the offer's adoption_key as its proof (the
// answer to kregd's challenge); then the
// session frames read by ReadOfferSessions from the rest of the stream, with a
// real sealed status page. Invariants: no offer is adopted (its key cannot
// verify), no frame is buffered past kMaxReadoptFrameBytes, and an offer that
// passes has exactly the sessions announced, each in its own slot with a valid
// target list.
//
// Input: byte 0 = sessions announced (mod 4); the rest is the byte stream.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "common/wire.h"
#include "daemon/base/adoption.h"
#include "daemon/base/status_page.h"
#include "daemon/base/validate.h"
#include "daemon/supervisor/readopt_listener.h"
#include "tests/fuzz/fuzz_util.h"

namespace kreg {
namespace {

constexpr uint32_t kSlots = 2;

void Judge(const std::string& first_frame) {
  v1::ExecReadopt m;
  if (!m.ParseFromString(first_frame)) return;
  PeerCred conn;
  conn.pid = m.pid();
  conn.uid = m.uid();
  AdoptionPolicy policy;
  policy.secret = std::string(32, 's');
  policy.settings_digest = m.settings_digest();
  policy.session_protocol_major = m.session_protocol_major();
  OfferJudgement j =
      JudgeOffer(m, conn, policy, std::string(kSupervisionChallengeBytes, 'c'),
                 m.adoption_key());
  if (j.verdict == OfferVerdict::kAdopt) fuzz::Fail("a forged offer verified");
  if (j.why.empty()) fuzz::Fail("a refusal without a reason");
}

}  // namespace
}  // namespace kreg

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kreg;
  static bool init = (fuzz::QuietLogs(), true);
  (void)init;
  if (size < 1) return 0;
  UniqueFd ours = fuzz::ClosedStream(data + 1, size - 1);
  if (!ours.ok()) return 0;
  // The listener's first read: one bounded frame, judged.
  std::string payload;
  std::vector<int> fds;
  const int rc =
      wire::RecvFrame(ours.get(), kMaxReadoptFrameBytes, &payload, &fds);
  for (int fd : fds) ::close(fd);
  if (payload.capacity() > 2 * size_t{kMaxReadoptFrameBytes} + (64 << 10)) {
    fuzz::Fail("a frame was buffered past the cap");
  }
  if (rc == wire::kOk) Judge(payload);
  // What follows the header: the session frames.
  absl::StatusOr<StatusPage> page = StatusPage::Create(kSlots);
  if (!page.ok()) return 0;
  std::vector<UniqueFd> page_fds;
  page_fds.emplace_back(::dup(page->fd()));
  v1::ExecReadopt header;
  header.set_slots(kSlots);
  header.set_sessions(data[0] % 4);
  absl::StatusOr<ReadoptOffer> offer = ReadOfferSessions(
      ours.get(), header, std::move(page_fds),
      std::chrono::steady_clock::now() + std::chrono::milliseconds(100));
  if (!offer.ok()) return 0;
  if (offer->sessions.size() != header.sessions()) {
    fuzz::Fail("an offer passed with other sessions than announced");
  }
  std::set<uint32_t> slots;
  for (const ReadoptOffer::Session& s : offer->sessions) {
    if (s.slot >= kSlots || !slots.insert(s.slot).second) {
      fuzz::Fail("an offer passed with a bad slot");
    }
    for (const auto& [key, token] : s.tokens) {
      if (!ValidateTargetName(key.name).ok()) {
        fuzz::Fail("an offer passed with a bad target name");
      }
    }
  }
  return 0;
}
