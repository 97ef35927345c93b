#include "common/wire.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

namespace kreg {
namespace wire {
namespace {

constexpr size_t kHeaderBytes = 4;
// The payload buffer starts at this size and doubles as bytes arrive.
constexpr size_t kFirstChunk = 64 << 10;
// A payload buffer above this capacity is freed before a much smaller frame.
constexpr size_t kKeepCapacity = 4 << 20;

void CloseAll(std::vector<int>* fds, size_t from) {
  for (size_t i = from; i < fds->size(); ++i) ::close((*fds)[i]);
  fds->resize(from);
}

// Collects SCM_RIGHTS descriptors from `msg`. Returns false (after closing
// them) if there were more than kMaxFdsPerFrame or the control data was cut.
bool TakeFds(msghdr* msg, std::vector<int>* fds) {
  bool ok = (msg->msg_flags & MSG_CTRUNC) == 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(msg); c != nullptr; c = CMSG_NXTHDR(msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; ++i) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds->push_back(fd);
    }
  }
  return ok;
}

// Waits until `sock` is ready for `events` (POLLIN: readable or the peer
// closed it; POLLOUT: room to write) or `*deadline` passes (no deadline:
// returns at once). kOk, kTimedOut or an errno.
int WaitReady(int sock, const Clock::time_point* deadline,
              short events = POLLIN) {  // NOLINT(runtime/int): pollfd's type
  if (deadline == nullptr) return kOk;
  for (;;) {
    auto left =
        std::chrono::ceil<std::chrono::milliseconds>(*deadline - Clock::now());
    if (left.count() <= 0) return kTimedOut;
    pollfd p{sock, events, 0};
    int ready = ::poll(
        &p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)));
    if (ready > 0) return kOk;
    if (ready < 0 && errno != EINTR) return errno;
  }
}

// Grows `payload` to `size` bytes; false when the budget is spent.
using Grow = bool (*)(void* ctx, std::string* payload, size_t size);

bool PlainGrow(void*, std::string* payload, size_t size) {
  payload->resize(size);
  return true;
}

bool BudgetGrow(void* ctx, std::string*, size_t size) {
  return static_cast<RecvBuffer*>(ctx)->Resize(size);
}

// Reads a `len`-byte payload into `payload`, growing it with the bytes that
// actually arrive (doubling from kFirstChunk) rather than allocating `len`
// up front: a peer that only announces a large frame costs nothing.
int ReadPayload(int sock, size_t len, std::string* payload, Grow grow,
                void* ctx, const Clock::time_point* deadline) {
  // A buffer left large by an earlier big frame is given back.
  if (payload->capacity() > kKeepCapacity && len < payload->capacity() / 4) {
    std::string().swap(*payload);
  }
  payload->clear();
  size_t done = 0;
  while (done < len) {
    if (done == payload->size()) {
      size_t target = std::max(kFirstChunk, 2 * done);
      if (payload->capacity() > target) target = payload->capacity();
      if (!grow(ctx, payload, std::min(len, target))) return kOverBudget;
    }
    if (int w = WaitReady(sock, deadline); w != kOk) {
      payload->resize(done);
      return w;
    }
    ssize_t n = ::recv(sock, &(*payload)[done], payload->size() - done, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      payload->resize(done);
      return errno;
    }
    if (n == 0) {
      payload->resize(done);
      return kTruncated;
    }
    done += static_cast<size_t>(n);
  }
  return kOk;
}

}  // namespace

bool ByteBudget::TryTake(uint64_t n) {
  uint64_t used = used_.load(std::memory_order_relaxed);
  do {
    if (n > limit_ || used > limit_ - n) return false;
  } while (
      !used_.compare_exchange_weak(used, used + n, std::memory_order_relaxed));
  return true;
}

BudgetHold& BudgetHold::operator=(BudgetHold&& other) noexcept {
  if (this != &other) {
    Set(0);
    budget_ = other.budget_;
    held_ = other.held_;
    other.held_ = 0;
  }
  return *this;
}

bool BudgetHold::Set(uint64_t n) {
  if (budget_ != nullptr) {
    if (n > held_) {
      if (!budget_->TryTake(n - held_)) return false;
    } else if (n < held_) {
      budget_->Give(held_ - n);
    }
  }
  held_ = n;
  return true;
}

bool RecvBuffer::Resize(size_t size) {
  if (budget_ != nullptr && size > held_) {
    if (!budget_->TryTake(size - held_)) return false;
    held_ = size;
  }
  payload_.resize(size);
  return true;
}

void RecvBuffer::Shrink(size_t keep) {
  if (payload_.capacity() > keep) {
    std::string().swap(payload_);
    Release();
  } else if (budget_ != nullptr && held_ > payload_.capacity()) {
    budget_->Give(held_ - payload_.capacity());
    held_ = payload_.capacity();
  }
}

void RecvBuffer::Release() {
  if (budget_ != nullptr && held_ > 0) budget_->Give(held_);
  held_ = 0;
}

std::string OverBudgetText(const ByteBudget& budget, uint64_t need,
                           const std::string& what) {
  return what + " needs " + std::to_string(need) +
         " bytes, but the receive buffers and launch caches of this "
         "executor's sessions already hold " +
         std::to_string(budget.used()) + " of their limit of " +
         std::to_string(budget.limit()) +
         " bytes (max_buffered_bytes); use fewer distinct large attributes "
         "at once, end idle sessions, or ask the operator to raise "
         "max_buffered_bytes";
}

std::string ResultText(int result) {
  switch (result) {
    case kOk:
      return "ok";
    case kEof:
      return "connection closed by peer";
    case kTooLarge:
      return "message larger than the limit";
    case kTooManyFds:
      return "too many file descriptors attached";
    case kTruncated:
      return "connection closed in the middle of a message";
    case kOverBudget:
      return "the receive buffers of this process's sessions are full";
    case kTimedOut:
      return "the message did not arrive in time";
    case kWouldBlock:
      return "the message has not arrived whole yet";
    case kMalformed:
      return "the message does not parse";
    default:
      return strerror(result);
  }
}

namespace {

int SendFrameImpl(int sock, const void* payload, size_t size, const int* fds,
                  int num_fds, const Clock::time_point* deadline) {
  if (size > UINT32_MAX) return EMSGSIZE;
  if (num_fds < 0 || num_fds > kMaxFdsPerFrame) return EINVAL;
  unsigned char header[kHeaderBytes];
  uint32_t len = static_cast<uint32_t>(size);
  for (size_t i = 0; i < kHeaderBytes; ++i) header[i] = (len >> (8 * i)) & 0xff;

  iovec iov[2];
  iov[0].iov_base = header;
  iov[0].iov_len = kHeaderBytes;
  iov[1].iov_base = const_cast<void*>(payload);
  iov[1].iov_len = size;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerFrame)];
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 2;
  if (num_fds > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * num_fds);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * num_fds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * num_fds);
  }
  size_t total = kHeaderBytes + size;
  size_t sent = 0;
  while (sent < total) {
    ssize_t n =
        ::sendmsg(sock, &msg, MSG_NOSIGNAL | (deadline ? MSG_DONTWAIT : 0));
    if (n < 0) {
      if (errno == EINTR) continue;
      if (deadline == nullptr || (errno != EAGAIN && errno != EWOULDBLOCK)) {
        return errno;
      }
      if (int w = WaitReady(sock, deadline, POLLOUT); w != kOk) return w;
      continue;
    }
    sent += static_cast<size_t>(n);
    // Descriptors went with the first chunk; advance the iovecs.
    msg.msg_control = nullptr;
    msg.msg_controllen = 0;
    size_t skip = static_cast<size_t>(n);
    while (msg.msg_iovlen > 0 && skip >= msg.msg_iov[0].iov_len) {
      skip -= msg.msg_iov[0].iov_len;
      ++msg.msg_iov;
      --msg.msg_iovlen;
    }
    if (msg.msg_iovlen > 0) {
      msg.msg_iov[0].iov_base =
          static_cast<char*>(msg.msg_iov[0].iov_base) + skip;
      msg.msg_iov[0].iov_len -= skip;
    }
  }
  return kOk;
}

}  // namespace

int SendFrame(int sock, const void* payload, size_t size, const int* fds,
              int num_fds) {
  return SendFrameImpl(sock, payload, size, fds, num_fds, nullptr);
}

int SendFrame(int sock, const void* payload, size_t size, const int* fds,
              int num_fds, Clock::time_point deadline) {
  return SendFrameImpl(sock, payload, size, fds, num_fds, &deadline);
}

namespace {

int RecvFrameImpl(int sock, uint32_t max_bytes, std::string* payload,
                  std::vector<int>* fds, Grow grow, void* ctx,
                  const Clock::time_point* deadline) {
  size_t first_fd = fds->size();
  unsigned char header[kHeaderBytes];
  size_t got = 0;
  bool fds_ok = true;
  // Read the header with recvmsg so the frame's descriptors are collected.
  while (got < kHeaderBytes) {
    if (int w = WaitReady(sock, deadline); w != kOk) {
      CloseAll(fds, first_fd);
      return w;
    }
    iovec iov{header + got, kHeaderBytes - got};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerFrame)];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      CloseAll(fds, first_fd);
      return err;
    }
    fds_ok = TakeFds(&msg, fds) && fds_ok;
    if (n == 0) {
      CloseAll(fds, first_fd);
      return got == 0 ? kEof : kTruncated;
    }
    got += static_cast<size_t>(n);
  }
  uint32_t len = 0;
  for (size_t i = 0; i < kHeaderBytes; ++i) {
    len |= static_cast<uint32_t>(header[i]) << (8 * i);
  }
  if (!fds_ok || fds->size() - first_fd > kMaxFdsPerFrame) {
    CloseAll(fds, first_fd);
    return kTooManyFds;
  }
  if (len > max_bytes) {
    CloseAll(fds, first_fd);
    return kTooLarge;
  }
  int rc = ReadPayload(sock, len, payload, grow, ctx, deadline);
  if (rc != kOk) CloseAll(fds, first_fd);
  return rc;
}

}  // namespace

int RecvFrame(int sock, uint32_t max_bytes, std::string* payload,
              std::vector<int>* fds) {
  return RecvFrameImpl(sock, max_bytes, payload, fds, &PlainGrow, nullptr,
                       nullptr);
}

int RecvFrame(int sock, uint32_t max_bytes, RecvBuffer* buffer,
              std::vector<int>* fds) {
  return RecvFrameImpl(sock, max_bytes, &buffer->payload(), fds, &BudgetGrow,
                       buffer, nullptr);
}

int RecvFrame(int sock, uint32_t max_bytes, RecvBuffer* buffer,
              std::vector<int>* fds, Clock::time_point deadline) {
  return RecvFrameImpl(sock, max_bytes, &buffer->payload(), fds, &BudgetGrow,
                       buffer, &deadline);
}

int TryPeekFrame(int sock, uint32_t max_bytes, std::string* payload,
                 bool* has_fds, bool* partial) {
  *has_fds = false;
  *partial = false;
  std::string buf(kHeaderBytes, '\0');
  size_t want = kHeaderBytes;
  for (;;) {
    // No control buffer: descriptors a peek duplicates are closed by the
    // kernel, which reports them as MSG_CTRUNC.
    iovec iov{buf.data(), want};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    ssize_t n = ::recvmsg(sock, &msg, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return kWouldBlock;
    if (n < 0) return errno;
    if ((msg.msg_flags & MSG_CTRUNC) != 0) {
      *has_fds = true;
      return kOk;
    }
    const size_t got = static_cast<size_t>(n);
    if (got == 0) return kEof;
    if (want == kHeaderBytes && got >= kHeaderBytes) {
      uint32_t len = 0;
      for (size_t i = 0; i < kHeaderBytes; ++i) {
        len |= static_cast<uint32_t>(static_cast<unsigned char>(buf[i]))
               << (8 * i);
      }
      if (len > max_bytes) return kTooLarge;
      want = kHeaderBytes + len;
      buf.resize(want);
      continue;
    }
    if (got == want) {
      payload->assign(buf, kHeaderBytes, std::string::npos);
      return kOk;
    }
    *partial = true;
    pollfd p{sock, POLLRDHUP, 0};
    if (::poll(&p, 1, 0) > 0 &&
        (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
      return kTruncated;
    }
    return kWouldBlock;
  }
}

void SpinUntilReadable(int sock, int64_t spin_us) {
  if (spin_us <= 0) return;
  auto start = std::chrono::steady_clock::now();
  char byte;
  do {
    if (::recv(sock, &byte, 1, MSG_PEEK | MSG_DONTWAIT) != -1 ||
        (errno != EAGAIN && errno != EINTR)) {
      return;
    }
  } while (std::chrono::steady_clock::now() - start <
           std::chrono::microseconds(spin_us));
}

}  // namespace wire
}  // namespace kreg
