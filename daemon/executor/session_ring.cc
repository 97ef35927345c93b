// The launch ring of a Session (DESIGN §9): setup over the socket, then a
// thread that takes descriptors off the ring, validates and runs them.
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/ring_layout.h"
#include "common/stage_trace.h"
#include "common/status_macros.h"
#include "daemon/base/log_limit.h"
#include "daemon/executor/launch_ring.h"
#include "daemon/executor/session.h"
#include "spdlog/spdlog.h"

namespace kreg {

absl::Status Session::DoRingSetup(const v1::RingSetup& setup,
                                  std::vector<UniqueFd> fds) {
  if (!limits_.launch_ring) {
    return absl::FailedPreconditionError(
        "this kregd serves no launch ring (HelloReply.launch_ring is 0)");
  }
  if (ring_ != nullptr) {
    return absl::FailedPreconditionError(
        "this session's launch ring is already set up");
  }
  if (setup.version() != ring::kVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "launch ring version ", setup.version(),
        " is not supported; kregd serves version ", ring::kVersion,
        " (the client library and kregd are from different releases; "
        "launches go on the session socket: update the older one)"));
  }
  if (fds.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RingSetup needs exactly one memfd attached, got ", fds.size()));
  }
  KREG_ASSIGN_OR_RETURN(ring_,
                        LaunchRing::Map(std::move(fds[0]), setup.size()));
  ring_exited_.store(false);
  ring_thread_ = std::thread([this] { RingLoop(); });
  return absl::OkStatus();
}

void Session::StopRing() {
  if (ring_ == nullptr) return;
  // A wake can race the ring thread going to sleep: repeat it until the
  // thread has left (it finishes a launch in progress first).
  ring_->Stop();
  while (!ring_exited_.load()) {
    ::usleep(1000);
    ring_->Stop();
  }
  ring_thread_.join();
  ring_.reset();
}

void Session::RingLoop() {
  ring::SpinPolicy spin(limits_.ring_spin_us * 1000);
  std::string descriptor;
  std::string why;
  for (;;) {
    LaunchRing::Next next = ring_->Take(&spin, &descriptor, &why);
    const int64_t picked_ns = ring::NowNs();
    if (next == LaunchRing::Next::kStopped) break;
    if (next == LaunchRing::Next::kBroken) {
      std::string more;
      if (PeerLogLimiter().Allow(absl::StrCat("uid ", peer_.uid), &more)) {
        spdlog::info("session {} (uid {} pid {}): closing: launch ring: {}{}",
                     id_, peer_.uid, peer_.pid, why, more);
      }
      ::shutdown(sock_.get(), SHUT_RDWR);  // ends Run(), which joins us
      break;
    }
    uint64_t tag = 0;
    uint32_t flags = 0;
    bool end_session = false;
    absl::Status status;
    stage::Times times{};
    times.ns[stage::kPicked] = picked_ns;
    {
      std::lock_guard<std::mutex> lock(mu_);
      status = RunRingLaunch(descriptor, &tag, &flags, &end_session, &times);
    }
    if (!status.ok() && backend_->LostDaemon()) {
      // The launch needed kregd (its target was not resolved yet) and
      // kregd is gone: not completed, the session ends, and the client
      // runs it again on a new session (it did not run).
      stage::SetCurrent(nullptr);
      ::shutdown(sock_.get(), SHUT_RDWR);
      break;
    }
    if (stage::Current() != nullptr) {
      // A traced launch (ring::kSubmitTrace): its stamps go back with it.
      stage::Mark(stage::kCompleted);
      const stage::Times& t = *stage::Current();
      ring::StageTrailer trace{};
      trace.present = 1;
      trace.picked_ns = t.ns[stage::kPicked];
      trace.decoded_ns = t.ns[stage::kDecoded];
      trace.handler_start_ns = t.ns[stage::kHandlerStart];
      trace.handler_end_ns = t.ns[stage::kHandlerEnd];
      trace.completed_ns = t.ns[stage::kCompleted];
      stage::SetCurrent(nullptr);
      ring_->Complete(tag, status, flags, &trace);
    } else {
      ring_->Complete(tag, status, flags);
    }
    if (end_session) {
      ::shutdown(sock_.get(), SHUT_RDWR);  // ends Run(), which joins us
      break;
    }
    if (backend_->ShouldStop()) {
      ::shutdown(sock_.get(), SHUT_RDWR);
      break;
    }
  }
  ring_exited_.store(true);
}

absl::Status Session::RunRingLaunch(const std::string& descriptor,
                                    uint64_t* tag, uint32_t* flags,
                                    bool* end_session, stage::Times* times) {
  counters_->launches.fetch_add(1, std::memory_order_relaxed);
  *flags = 0;
  absl::Status status;
  absl::StatusOr<RingLaunchHeader> header = ring_decoder_.Header(
      descriptor.data(), descriptor.size(), ring_->seq(), tag);
  const bool async = header.ok() && (header->flags & ring::kSubmitAsync) != 0;
  if (header.ok() && (header->flags & ring::kSubmitTrace) != 0) {
    stage::SetCurrent(times);  // cleared once the completion is out
  }
  if (!header.ok()) {
    status = header.status();
    // An unreadable header is not signalled (nothing in it can be
    // trusted, its flags included): the client library never writes one.
  } else {
    LaunchExecutor::Request request{
        *tag, &*header, [&](const CudaBufferResolver* resolve) {
          auto decoded =
              ring_decoder_.Decode(descriptor.data(), descriptor.size(),
                                   ring_->seq(), arena_, tag, resolve);
          stage::Mark(stage::kDecoded);
          return decoded;
        }};
    status =
        executors_[static_cast<size_t>(header->platform)]->Launch(&request);
    *flags = request.flags;
    *end_session = request.end_session;
  }
  if (!status.ok()) {
    counters_->launch_errors.fetch_add(1, std::memory_order_relaxed);
    // The client of an asynchronous launch sees this error only on its
    // next call (if it makes one): say it here too.
    std::string more;
    if (async &&
        PeerLogLimiter().Allow(absl::StrCat("uid ", peer_.uid), &more)) {
      spdlog::warn(
          "session {} (uid {} pid {}): asynchronous launch of \"{}\" "
          "failed (the client sees it on its next call): {}{}",
          id_, peer_.uid, peer_.pid,
          header.ok() ? std::string(header->target) : std::string("?"),
          std::string(status.message()), more);
    }
    if (*end_session) {
      spdlog::warn(
          "session {} (uid {} pid {}): closing: the doorbell of a failed "
          "asynchronous launch could not be signalled, and the client's "
          "stream waits for it",
          id_, peer_.uid, peer_.pid);
    }
  }
  return status;
}

}  // namespace kreg
