// Framing of the session socket transport (see proto/kreg/v1/session.proto):
// a 4-byte little-endian length, then the payload; file descriptors travel as
// SCM_RIGHTS on the frame's first byte. Shared by kregd and the in-process
// shim, so it depends on nothing but libc (no absl, no protobuf).
#ifndef KREGD_COMMON_WIRE_H_
#define KREGD_COMMON_WIRE_H_

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kreg {
namespace wire {

// At most this many descriptors per frame; more are closed and reported.
constexpr int kMaxFdsPerFrame = 32;

// Result of a frame operation: 0 or an errno value, or one of these.
enum : int {
  kOk = 0,
  kEof = -1,       // the peer closed the connection (before a frame began)
  kTooLarge = -2,  // the frame's declared length exceeds the limit
  kTooManyFds = -3,
  kTruncated = -4,   // the peer closed the connection inside a frame
  kOverBudget = -5,  // the receive buffers' shared budget is spent
  kTimedOut = -6,    // the deadline passed before the whole frame went through
  kWouldBlock = -7,  // TryPeekFrame: the frame is not all there yet
  kMalformed = -8,   // RecvMessage: the frame is not the message expected
};

using Clock = std::chrono::steady_clock;

// The bytes that the receive buffers of many connections (all sessions of a
// process) may hold at once. Thread-safe.
class ByteBudget {
 public:
  explicit ByteBudget(uint64_t limit) : limit_(limit) {}
  // Takes `n` bytes; false (taking nothing) when that would exceed the
  // limit.
  bool TryTake(uint64_t n);
  void Give(uint64_t n) { used_.fetch_sub(n, std::memory_order_relaxed); }
  uint64_t used() const { return used_.load(std::memory_order_relaxed); }
  uint64_t limit() const { return limit_; }

 private:
  const uint64_t limit_;
  std::atomic<uint64_t> used_{0};
};

// Bytes that one cache entry (or any owner other than a RecvBuffer) holds of
// a budget (null: unbounded), given back when it is destroyed or Set lower.
// Movable, not copyable; not thread-safe.
class BudgetHold {
 public:
  explicit BudgetHold(ByteBudget* budget = nullptr) : budget_(budget) {}
  ~BudgetHold() { Set(0); }
  BudgetHold(BudgetHold&& other) noexcept
      : budget_(other.budget_), held_(other.held_) {
    other.held_ = 0;
  }
  BudgetHold& operator=(BudgetHold&& other) noexcept;
  BudgetHold(const BudgetHold&) = delete;
  BudgetHold& operator=(const BudgetHold&) = delete;

  // Holds `n` bytes instead of held(): takes the increase from the budget
  // first (false, unchanged, when it cannot cover it) or gives the decrease
  // back.
  bool Set(uint64_t n);
  uint64_t held() const { return held_; }
  ByteBudget* budget() const { return budget_; }

 private:
  ByteBudget* budget_;
  uint64_t held_ = 0;
};

// The message of a cache that `budget` cannot cover: "<what> needs <need>
// bytes, but ... hold <used> of max_buffered_bytes (<limit>) ...". For
// RESOURCE_EXHAUSTED errors.
std::string OverBudgetText(const ByteBudget& budget, uint64_t need,
                           const std::string& what);

// One connection's receive buffer and what it holds of a budget (null:
// unbounded). Give the buffer back with Shrink (after each frame) and
// Release (when the connection ends).
class RecvBuffer {
 public:
  explicit RecvBuffer(ByteBudget* budget = nullptr) : budget_(budget) {}
  ~RecvBuffer() { Release(); }
  RecvBuffer(const RecvBuffer&) = delete;
  RecvBuffer& operator=(const RecvBuffer&) = delete;

  std::string& payload() { return payload_; }
  // Grows the buffer to `size` bytes, taking what it adds from the budget
  // first; false (unchanged) when the budget cannot cover it.
  bool Resize(size_t size);
  // Frees the buffer (giving its bytes back) if it holds more than `keep`
  // bytes.
  void Shrink(size_t keep);
  void Release();
  uint64_t held() const { return held_; }

 private:
  ByteBudget* const budget_;
  std::string payload_;
  uint64_t held_ = 0;  // taken from budget_
};

// Human-readable text for a result code.
std::string ResultText(int result);

// Sends `payload` as one frame with `fds` attached (not closed). Blocks until
// written; retries EINTR; never raises SIGPIPE. Returns kOk or an errno.
int SendFrame(int sock, const void* payload, size_t size, const int* fds,
              int num_fds);
// The same, but never waits past `deadline` for room in the socket's buffer:
// a peer that stopped reading gets kTimedOut then, and the frame may be
// partly written (the connection is of no further use).
int SendFrame(int sock, const void* payload, size_t size, const int* fds,
              int num_fds, Clock::time_point deadline);

// Receives one frame of at most `max_bytes` into `payload`. Received
// descriptors are appended to `fds` (the caller owns and must close them;
// on error they are closed). Returns kOk, kEof, kTooLarge, kTooManyFds,
// kTruncated or an errno. Memory follows the bytes received, not the
// declared length: `payload` grows from 64 KiB, doubling as bytes arrive (at
// most twice what arrived), so announcing a large frame costs nothing; after
// an error it holds the bytes that did arrive. A buffer over 4 MiB left by
// an earlier frame is freed before a frame under a quarter of its size.
int RecvFrame(int sock, uint32_t max_bytes, std::string* payload,
              std::vector<int>* fds);
// The same into `buffer`, whose growth is taken from its budget first:
// kOverBudget when the budget cannot cover the next step.
int RecvFrame(int sock, uint32_t max_bytes, RecvBuffer* buffer,
              std::vector<int>* fds);
// The same, but every byte of the frame (header, descriptors, payload) must
// arrive by `deadline`: the socket is polled before each read, so a peer
// that sends part of a frame and stalls gets kTimedOut at the deadline.
int RecvFrame(int sock, uint32_t max_bytes, RecvBuffer* buffer,
              std::vector<int>* fds, Clock::time_point deadline);

// Sends the protobuf `message` as one frame with `fds` attached (not
// closed), never waiting past `*deadline` when given: SendFrame's result.
// A template, so that this header needs no protobuf (the includer links
// protobuf or protobuf-lite).
template <typename Message>
int SendMessage(int sock, const Message& message, const int* fds = nullptr,
                int num_fds = 0, const Clock::time_point* deadline = nullptr) {
  const std::string out = message.SerializeAsString();
  return deadline == nullptr
             ? SendFrame(sock, out.data(), out.size(), fds, num_fds)
             : SendFrame(sock, out.data(), out.size(), fds, num_fds, *deadline);
}
// Receives one frame of at most `max_bytes` into the protobuf `*message`,
// closing the descriptors attached: RecvFrame's result, or kMalformed.
template <typename Message>
int RecvMessage(int sock, uint32_t max_bytes, Message* message) {
  std::string payload;
  std::vector<int> fds;
  int rc = RecvFrame(sock, max_bytes, &payload, &fds);
  for (int fd : fds) ::close(fd);
  if (rc == kOk && !message->ParseFromString(payload)) rc = kMalformed;
  return rc;
}

// Looks once, without waiting, at the next frame of `sock` without taking
// it (MSG_PEEK), so that another reader (an executor kregd hands the socket
// to) still receives it whole. Descriptors are never received (what a peek
// duplicates is closed by the kernel). kOk when the whole frame is there
// (`payload` its body) or when it carries descriptors (`*has_fds`, `payload`
// unset: receive it with RecvFrame and a deadline), kWouldBlock when it is not
// all there yet
// (`*partial` says whether some of it is), or kEof, kTooLarge (over
// `max_bytes`), kTruncated (the peer closed inside the frame) or an errno.
// For a caller that waits for readability itself (a parked connection,
// daemon/base/connection_parker.h), so a half frame costs nothing while it
// waits.
int TryPeekFrame(int sock, uint32_t max_bytes, std::string* payload,
                 bool* has_fds, bool* partial);

// Busy-polls `sock` for up to `spin_us` microseconds until a byte is readable
// (or the peer closed), so that a fast reply skips the blocking wake-up.
// Returns at once when spin_us <= 0.
void SpinUntilReadable(int sock, int64_t spin_us);

}  // namespace wire
}  // namespace kreg

#endif  // KREGD_COMMON_WIRE_H_
