// Fuzzes what kregd reads from an executor's control socket while it waits
// for a re-point's acknowledgement (Executor::AwaitRepointAck,
// docs/replace.md section 3): the executor runs untrusted kernels, which
// may write anything there. The stream is read after the peer closed it,
// with the deadline already passed (what is there is still read).
// Invariants: no frame is buffered past kMaxRepointAckBytes, and the answer
// is an absl code (0..16): an ack's status, DEADLINE_EXCEEDED or
// UNAVAILABLE.
//
// Input: byte 0 = the generation awaited (mod 4); the rest is the stream.
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "daemon/base/status_page.h"
#include "daemon/supervisor/executor.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kreg;
  static bool init = (fuzz::QuietLogs(), true);
  (void)init;
  if (size < 1) return 0;
  UniqueFd ours = fuzz::ClosedStream(data + 1, size - 1);
  if (!ours.ok()) return 0;
  absl::StatusOr<StatusPage> page = StatusPage::Create(1);
  if (!page.ok()) return 0;
  // An Executor over the socket, as for a re-adopted one; its pid is this
  // process's (Abandon()ed: nothing waits on or signals it).
  absl::StatusOr<std::unique_ptr<Executor>> exec = Executor::Readopt(
      ::getpid(), std::move(ours), *std::move(page), v1::ExecInitReply());
  if (!exec.ok()) return 0;
  v1::ExecRepoint r;
  r.set_target_name("op");
  r.set_platform("cpu");
  r.set_generation(data[0] % 4);
  absl::Status s = (*exec)->AwaitRepointAck(r, absl::Now());
  const int code = static_cast<int>(s.code());
  if (code < 0 || code > 16) fuzz::Fail("an answer that is no absl code");
  (*exec)->Abandon();
  return 0;
}
