#include "client/shim/repoint_watch.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "client/shim/conn.h"
#include "common/status_macros.h"
#include "common/unique_fd.h"
#include "common/wire.h"
#include "kreg/v1/session.pb.h"

namespace kreg {
namespace shim {
namespace {

// A notice is a name, a digest and sizes; this bounds a misbehaving peer.
constexpr uint32_t kMaxNoticeBytes = 64u << 10;
// What an ack's error text may take (kregd reads at most 16 KiB).
constexpr size_t kMaxAckMessage = 8u << 10;

std::mutex g_mu;
pid_t g_pid = 0;  // guarded by g_mu
std::set<std::string>* g_watched = new std::set<std::string>();  // paths

ClientStatus OpenWatch(const std::string& path, std::unique_ptr<Conn>* out) {
  KREG_RETURN_IF_ERROR(Conn::Open(path, out, /*control=*/true));
  v1::SessionRequest req;
  req.mutable_watch();
  v1::SessionResponse resp;
  ClientStatus s = (*out)->Call(&req, &resp);
  if (s.ok() && !resp.has_watch()) {
    s = ClientStatus::Error(kInternal,
                            "kregd answered watch without a WatchReply");
  }
  return s;
}

// Serves `conn`, then reopens the watch (kregd restarted: its sessions are
// re-established by the Client, and their local holds with them).
void WatchLoop(std::string path, std::unique_ptr<Conn> conn,
               RepointApplier apply) {
  auto backoff = std::chrono::milliseconds(100);
  for (;;) {
    if (conn != nullptr) {
      ServeRepoints(conn->fd(), apply);
      conn.reset();
      backoff = std::chrono::milliseconds(100);
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(30000));
    std::unique_ptr<Conn> fresh;
    if (OpenWatch(path, &fresh).ok()) conn = std::move(fresh);
  }
}

}  // namespace

ClientStatus WatchRepoints(const std::string& session_path,
                           RepointApplier apply) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_pid != ::getpid()) {  // a forked child watches on its own
    g_pid = ::getpid();
    g_watched->clear();
  }
  if (g_watched->count(session_path) != 0) return ClientStatus::Ok();
  std::unique_ptr<Conn> conn;
  KREG_RETURN_IF_ERROR(OpenWatch(session_path, &conn));
  std::thread(WatchLoop, session_path, std::move(conn), apply).detach();
  g_watched->insert(session_path);
  return ClientStatus::Ok();
}

ClientStatus ServeRepoints(int sock, RepointApplier apply) {
  std::string payload;
  for (;;) {
    std::vector<int> raw;
    const int rc = wire::RecvFrame(sock, kMaxNoticeBytes, &payload, &raw);
    std::vector<UniqueFd> fds;
    for (int fd : raw) fds.emplace_back(fd);
    if (rc != wire::kOk) {
      return ClientStatus::Error(
          kUnavailable,
          "kreg: the watch connection to kregd ended: " + wire::ResultText(rc));
    }
    v1::SessionResponse notice;
    if (!notice.ParseFromString(payload)) {
      return ClientStatus::Error(
          kInternal,
          "kreg: kregd sent a malformed frame on the watch "
          "connection (" +
              std::to_string(payload.size()) + " bytes)");
    }
    if (!notice.has_repoint()) {
      return ClientStatus::Error(
          notice.status().code() != 0 ? notice.status().code() : kInternal,
          "kreg: kregd ended the watch connection: " +
              notice.status().message());
    }
    const v1::Repoint& r = notice.repoint();
    uint32_t pinned = 0;
    ClientStatus s =
        fds.size() == 1
            ? apply(r, std::move(fds[0]), &pinned)
            : ClientStatus::Error(
                  kInvalidArgument,
                  "kreg: kregd's notice moving \"" + r.target_name() +
                      "\" to generation " + std::to_string(r.generation()) +
                      " came with " + std::to_string(fds.size()) +
                      " file descriptors, not the module's one; nothing "
                      "was loaded");
    if (!s.ok()) std::fprintf(stderr, "%s\n", s.message.c_str());
    v1::SessionRequest ack;
    v1::RepointAck* a = ack.mutable_repoint_ack();
    a->set_target_name(r.target_name());
    a->set_platform(r.platform());
    a->set_generation(pinned != 0 ? pinned : r.generation());
    a->set_pinned(pinned);
    if (!s.ok()) {
      a->mutable_status()->set_code(s.code);
      a->mutable_status()->set_message(s.message.substr(0, kMaxAckMessage));
    }
    const int sent = wire::SendMessage(sock, ack);
    if (sent != wire::kOk) {
      return ClientStatus::Error(kUnavailable,
                                 "kreg: the watch connection to kregd ended: " +
                                     wire::ResultText(sent));
    }
  }
}

}  // namespace shim
}  // namespace kreg
