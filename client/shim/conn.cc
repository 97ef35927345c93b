#include "client/shim/conn.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <utility>
#include <vector>

#include "client/shim/cuda_session.h"
#include "client/shim/cuda_trace.h"
#include "client/shim/ring_client.h"
#include "common/paths.h"
#include "common/ring_layout.h"
#include "common/session_protocol.h"
#include "common/status_macros.h"
#include "common/wire.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace shim {
namespace {

// How to start the kregd a session socket belongs to (its --socket is the
// session socket's path without ".session"), as the admin client says it.
std::string StartHint(const std::string& session_path) {
  static const std::string kSuffix = ".session";
  std::string admin = session_path;
  if (admin.size() > kSuffix.size() &&
      admin.compare(admin.size() - kSuffix.size(), kSuffix.size(), kSuffix) ==
          0) {
    admin.resize(admin.size() - kSuffix.size());
  }
  return ". Start it with `kregd --socket " + admin +
         "` or `systemctl start kregd`";
}

// Responses are small; this only bounds a misbehaving peer.
constexpr uint32_t kMaxResponseBytes = 256u << 20;
constexpr uint64_t kMinArenaBytes = 1u << 20;
constexpr uint64_t kPage = 4096;

std::string Errno(int err) { return strerror(err); }

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* env = getenv(name);
  return env ? std::max<int64_t>(0, atoll(env)) : fallback;
}

// Microseconds to busy-poll for a reply before blocking ($KREG_SPIN_US,
// default 0: block at once. A spin can save the wake-up latency
// when the daemon answers fast and a core is free).
int64_t SpinMicros() {
  static const int64_t us = EnvInt("KREG_SPIN_US", 0);
  return us;
}

// The launch ring: $KREG_LAUNCH_RING=0 keeps CPU launches on the socket.
bool RingWanted() {
  static const bool wanted = [] {
    const char* env = getenv("KREG_LAUNCH_RING");
    return env == nullptr || std::string(env) != "0";
  }();
  return wanted;
}

// Nanoseconds a ring launch spins for its completion before it sleeps
// ($KREG_RING_SPIN_US, default 200), and the longest sleep between two
// looks at the socket ($KREG_RING_SLICE_MS, default 10).
int64_t RingSpinNs() {
  static const int64_t ns = EnvInt("KREG_RING_SPIN_US", 200) * 1000;
  return ns;
}
int64_t RingSliceNs() {
  static const int64_t ns =
      std::max<int64_t>(1, EnvInt("KREG_RING_SLICE_MS", 10)) * 1000000;
  return ns;
}

}  // namespace

Conn::Conn(int sock, std::string path) : path_(std::move(path)), sock_(sock) {}

Conn::~Conn() {
  DestroyCudaConnState(cuda_state);
  ring_.reset();
  if (arena_ != nullptr) ::munmap(arena_, arena_size_);
  if (sock_ >= 0) ::close(sock_);
}

ClientStatus Conn::Open(const std::string& path, std::unique_ptr<Conn>* out,
                        bool control) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return ClientStatus::Error(kInvalidArgument,
                               "kregd session socket path \"" + path +
                                   "\" is empty or too long for a Unix socket");
  }
  int sock = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock < 0) {
    return ClientStatus::Error(kInternal, "socket(AF_UNIX): " + Errno(errno));
  }
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int rc;
  do {
    rc = ::connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    int err = errno;
    ::close(sock);
    if (std::string why = SocketPermissionProblem(path);
        err == EACCES && !why.empty()) {
      return ClientStatus::Error(kPermissionDenied, why);
    }
    return ClientStatus::Error(
        kUnavailable, "cannot connect to the kregd session socket " + path +
                          ": " + Errno(err) + " (is kregd running?)" +
                          StartHint(path));
  }
  std::unique_ptr<Conn> conn(new Conn(sock, path));
  v1::SessionRequest req;
  v1::Hello* hello =
      control ? req.mutable_control_hello() : req.mutable_hello();
  hello->set_protocol_major(kSessionProtocolMajor);
  hello->set_protocol_minor(kSessionProtocolMinor);
  hello->set_pid(::getpid());
  hello->set_ffi_api_major(XLA_FFI_API_MAJOR);
  hello->set_ffi_api_minor(XLA_FFI_API_MINOR);
  v1::SessionResponse resp;
  KREG_RETURN_IF_ERROR(conn->Call(&req, &resp));
  if (!resp.has_hello()) {
    return ClientStatus::Error(kInternal,
                               "kregd answered Hello without HelloReply");
  }
  std::string refusal;
  if (!NegotiateSessionProtocol(
          {resp.hello().protocol_major(), resp.hello().protocol_minor()},
          {kSessionProtocolMajor, kSessionProtocolMinor},
          &conn->protocol_minor_, &refusal)) {
    return ClientStatus::Error(kFailedPrecondition,
                               "kregd at " + path + ": " + refusal);
  }
  conn->hello_ = resp.hello();
  const uint32_t offered = resp.hello().launch_ring();
  if (offered == ring::kVersion && RingWanted()) {
    KREG_RETURN_IF_ERROR(conn->SetUpRing());
  } else if (offered != 0 && RingWanted()) {
    Trace(
        "session %llu: kregd serves launch ring version %u, this client "
        "speaks version %u: launches go on the session socket (update the "
        "older of the two)",
        static_cast<unsigned long long>(conn->hello_.session_id()), offered,
        ring::kVersion);
  }
  *out = std::move(conn);
  return ClientStatus::Ok();
}

ClientStatus Conn::Transport(const std::string& what, int result) {
  broken_ = true;
  if (result == wire::kEof || result == wire::kTruncated ||
      result == ECONNRESET || result == EPIPE) {
    ended_ = true;
  }
  return ClientStatus::Error(kUnavailable,
                             "kregd session " + path_ + ": " + what +
                                 " failed: " + wire::ResultText(result) +
                                 " (did kregd stop?)" + StartHint(path_));
}

ClientStatus Conn::Call(v1::SessionRequest* request,
                        v1::SessionResponse* response, const int* fds,
                        int num_fds, UniqueFd* received) {
  if (broken_) {
    return ClientStatus::Error(kUnavailable,
                               "kregd session " + path_ + " is closed");
  }
  // kregd serves the ring and the socket in arrival order only per
  // channel: asynchronous ring launches complete before anything is sent
  // here (their errors are kept for the next launch).
  if (!async_targets_.empty()) {
    KREG_RETURN_IF_ERROR(ReapAsync(true));
  }
  uint64_t id = next_id_++;
  request->set_id(id);
  out_buf_.clear();
  request->SerializeToString(&out_buf_);
  const uint64_t max_message_bytes = hello_.max_message_bytes();
  if (max_message_bytes != 0 && out_buf_.size() > max_message_bytes) {
    return ClientStatus::Error(
        kResourceExhausted, "session message of " +
                                std::to_string(out_buf_.size()) +
                                " bytes exceeds kregd's max_message_bytes (" +
                                std::to_string(max_message_bytes) + ")");
  }
  if (request->has_launch()) launch_sent_ = true;
  int rc =
      wire::SendFrame(sock_, out_buf_.data(), out_buf_.size(), fds, num_fds);
  if (rc != wire::kOk) return Transport("send", rc);
  wire::SpinUntilReadable(sock_, SpinMicros());
  std::vector<int> got_fds;
  rc = wire::RecvFrame(sock_, kMaxResponseBytes, &in_buf_, &got_fds);
  for (size_t i = 0; i < got_fds.size(); ++i) {
    if (i == 0 && received != nullptr && rc == wire::kOk) {
      received->reset(got_fds[i]);
    } else {
      ::close(got_fds[i]);
    }
  }
  if (rc != wire::kOk) return Transport("receive", rc);
  if (!response->ParseFromString(in_buf_)) {
    broken_ = true;
    return ClientStatus::Error(kInternal,
                               "kregd sent a malformed session response");
  }
  if (response->id() != id && response->id() != 0) {
    broken_ = true;
    return ClientStatus::Error(
        kInternal, "kregd answered request " + std::to_string(response->id()) +
                       " instead of " + std::to_string(id));
  }
  if (response->status().code() != 0) {
    if (response->id() == 0) {  // connection-level refusal
      broken_ = true;
      refused_ = true;
      ended_ = true;
    }
    return ClientStatus::Error(response->status().code(),
                               response->status().message());
  }
  return ClientStatus::Ok();
}

ClientStatus Conn::SetUpRing() {
  std::unique_ptr<ClientRing> ring;
  if (!ClientRing::Create(RingSpinNs(), &ring).ok()) {
    return ClientStatus::Ok();  // socket
  }
  v1::SessionRequest req;
  req.mutable_ring_setup()->set_size(ring::kRegionBytes);
  req.mutable_ring_setup()->set_version(ring::kVersion);
  v1::SessionResponse resp;
  int fd = ring->fd();
  ClientStatus s = Call(&req, &resp, &fd, 1);
  if (broken_) return s;
  ring->CloseFd();  // the mappings keep the region alive
  if (s.ok()) ring_ = std::move(ring);
  return ClientStatus::Ok();
}

ClientStatus Conn::Unsolicited(bool idle) {
  std::vector<int> got_fds;
  int rc = wire::RecvFrame(sock_, kMaxResponseBytes, &in_buf_, &got_fds);
  for (int fd : got_fds) ::close(fd);
  if (rc != wire::kOk) {
    ClientStatus s =
        Transport(idle ? "an idle session" : "a launch ring call", rc);
    if (!idle) return s;
    return ClientStatus::Error(
        kUnavailable, "kregd ended session " +
                          std::to_string(hello_.session_id()) + " (" +
                          wire::ResultText(rc) + "): its executor went away");
  }
  broken_ = true;
  v1::SessionResponse response;
  if (!response.ParseFromString(in_buf_) || response.id() != 0 ||
      response.status().code() == 0) {
    return ClientStatus::Error(
        kInternal,
        std::string("kregd sent an unexpected session response ") +
            (idle ? "to an idle session" : "while a launch ring call waited"));
  }
  refused_ = true;
  ended_ = true;
  return ClientStatus::Error(response.status().code(),
                             response.status().message());
}

ClientStatus Conn::AwaitOne(int* code, std::string* message, uint32_t* flags) {
  for (;;) {
    ClientRing::Wait w = ring_->Await(RingSliceNs(), code, message, flags);
    if (w == ClientRing::Wait::kDone) return ClientStatus::Ok();
    // The sleep ended, or the executor left the ring: has kregd said
    // something (its executor died) or has the session ended?
    pollfd p{sock_, POLLIN, 0};
    int ready = ::poll(&p, 1, w == ClientRing::Wait::kClosed ? 10 : 0);
    if (ready > 0) return Unsolicited(/*idle=*/false);
  }
}

ClientStatus Conn::LaunchCpu(const ring::DescriptorView& launch,
                             v1::SessionRequest* request,
                             v1::SessionResponse* response) {
  if (!async_targets_.empty()) {
    KREG_RETURN_IF_ERROR(ReapAsync(true));
  }
  if (!async_error_.ok()) return TakeAsyncError();
  bool submitted = false;
  KREG_RETURN_IF_ERROR(SubmitRing(launch, /*async=*/false, "", &submitted));
  if (!submitted) {
    request->Clear();
    ring::EncodeDescriptor(launch,
                           request->mutable_launch()->mutable_descriptor());
    return Call(request, response);
  }
  uint32_t flags;
  return AwaitRing(&flags);
}

ClientStatus Conn::SubmitRing(const ring::DescriptorView& launch, bool async,
                              const std::string& target, bool* submitted) {
  *submitted = false;
  if (ring_ == nullptr || broken_) return ClientStatus::Ok();
  if (!async && !async_targets_.empty()) {
    KREG_RETURN_IF_ERROR(ReapAsync(true));
  }
  while (ring_->in_flight() >= ring::kSlots) {  // full: the oldest first
    KREG_RETURN_IF_ERROR(ReapOne());
  }
  if (!ring_->Submit(launch, next_id_)) return ClientStatus::Ok();
  ++next_id_;
  *submitted = true;
  launch_sent_ = true;
  if (async) async_targets_.push_back(target);
  return ClientStatus::Ok();
}

ClientStatus Conn::AwaitRing(uint32_t* flags) {
  int code = 0;
  *flags = 0;
  KREG_RETURN_IF_ERROR(AwaitOne(&code, &ring_message_, flags));
  if (code == 0) return ClientStatus::Ok();
  return ClientStatus::Error(code, ring_message_);
}

ClientStatus Conn::ReapOne() {
  int code = 0;
  uint32_t flags = 0;
  std::string message;
  ClientStatus s = AwaitOne(&code, &message, &flags);
  if (!s.ok()) {
    async_targets_.clear();
    return s;
  }
  // Only asynchronous launches stay in flight between calls.
  std::string target;
  if (!async_targets_.empty()) {
    target = std::move(async_targets_.front());
    async_targets_.pop_front();
  }
  if (flags & ring::kMappingMissing) ForgetCudaMappings(cuda_state);
  if (code != 0) {
    Trace("asynchronous launch of \"%s\" failed: code %d %s", target.c_str(),
          code, message.c_str());
    if (async_error_.ok()) {
      async_error_ = ClientStatus::Error(
          code, "kreg: an earlier asynchronous launch of \"" + target +
                    "\" failed (KREG_ASYNC_LAUNCH=1 reports it on the "
                    "session's next call; that call was not run): " +
                    message);
    }
  }
  return ClientStatus::Ok();
}

ClientStatus Conn::ReapAsync(bool all) {
  while (!async_targets_.empty() && ring_ != nullptr && !broken_) {
    if (!all && !ring_->Ready()) break;
    KREG_RETURN_IF_ERROR(ReapOne());
  }
  return ClientStatus::Ok();
}

ClientStatus Conn::TakeAsyncError() {
  ClientStatus s = std::move(async_error_);
  async_error_ = ClientStatus::Ok();
  return s;
}

ClientStatus Conn::EnsureArena(uint64_t bytes) {
  if (bytes <= arena_size_) return ClientStatus::Ok();
  const uint64_t max_arena_bytes = hello_.max_arena_bytes();
  if (bytes > max_arena_bytes) {
    return ClientStatus::Error(
        kResourceExhausted,
        "this call needs " + std::to_string(bytes) +
            " bytes of session shared memory; kregd allows at most " +
            std::to_string(max_arena_bytes) + " (max_arena_bytes)");
  }
  uint64_t size = std::max({bytes, arena_size_ * 2, kMinArenaBytes});
  size = (size + kPage - 1) / kPage * kPage;
  size = std::min(size, max_arena_bytes);
  int fd;
  char* base;
  ClientStatus s = CreateSharedRegion(
      "kreg-arena", size, "a " + std::to_string(size) + " byte session arena",
      &fd, &base);
  if (!s.ok()) return s;
  v1::SessionRequest req;
  req.mutable_arena_grow()->set_size(size);
  v1::SessionResponse resp;
  s = Call(&req, &resp, &fd, 1);
  ::close(fd);  // the mappings keep the memory alive
  if (!s.ok()) {
    ::munmap(base, size);
    return s;
  }
  if (arena_ != nullptr) ::munmap(arena_, arena_size_);
  arena_ = base;
  arena_size_ = size;
  return ClientStatus::Ok();
}

}  // namespace shim
}  // namespace kreg
