// A scripted fake kregd on a temp Unix socket for the shim's unit tests
// (conn_test): it speaks session.proto over
// common/wire framing only and records what the shim sent.
#ifndef KREGD_TESTS_CLIENT_SHIM_FAKE_KREGD_H_
#define KREGD_TESTS_CLIENT_SHIM_FAKE_KREGD_H_

#include <fcntl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "catch2/catch.hpp"
#include "common/wire.h"
#include "kreg/v1/session.pb.h"
#include "tests/client/shim/temp_socket.h"

namespace kreg::shim {

// One accepted session, as the fake's script sees it. Used on the fake's
// thread only; what it records is read after the thread has ended.
class Peer {
 public:
  explicit Peer(int sock) : sock_(sock) {}

  // The next request and its fds (closed here, counted); false at the end
  // of the connection or on a frame that does not parse.
  bool Recv(v1::SessionRequest* req) {
    std::string in;
    std::vector<int> fds;
    if (wire::RecvFrame(sock_, 64 << 20, &in, &fds) != wire::kOk) return false;
    for (int fd : fds) {
      struct stat st;
      fd_sizes.push_back(::fstat(fd, &st) == 0 ? st.st_size : -1);
      fd_seals.push_back(::fcntl(fd, F_GET_SEALS));
      ::close(fd);
    }
    if (!req->ParseFromString(in)) return false;
    requests.push_back(*req);
    return true;
  }
  void Send(const v1::SessionResponse& resp, const int* fds = nullptr,
            int num_fds = 0) {
    std::string out;
    resp.SerializeToString(&out);
    SendRaw(out, fds, num_fds);
  }
  void SendRaw(const std::string& bytes, const int* fds = nullptr,
               int num_fds = 0) {
    wire::SendFrame(sock_, bytes.data(), bytes.size(), fds, num_fds);
  }
  // Bytes as they are, without a frame header (a forged header).
  void Write(const std::string& bytes) {
    (void)!::write(sock_, bytes.data(), bytes.size());
  }
  // Answers `req`'s id with `code` and `message`.
  void Fail(const v1::SessionRequest& req, int code,
            const std::string& message) {
    v1::SessionResponse resp;
    resp.set_id(req.id());
    resp.mutable_status()->set_code(code);
    resp.mutable_status()->set_message(message);
    Send(resp);
  }
  // Reads the Hello and answers it with `reply`.
  bool Hello(const v1::HelloReply& reply) {
    v1::SessionRequest req;
    if (!Recv(&req) || !req.has_hello()) return false;
    v1::SessionResponse resp;
    resp.set_id(req.id());
    *resp.mutable_hello() = reply;
    Send(resp);
    return true;
  }

  std::vector<v1::SessionRequest> requests;
  std::vector<int64_t> fd_sizes;
  std::vector<int> fd_seals;

 private:
  const int sock_;
};

// A fake kregd: a listening socket in a temp directory and one thread that
// accepts one session, runs `script` on it, then closes it (the Conn sees
// the end of the session at its next read).
class FakeKregd {
 public:
  using Script = std::function<void(Peer*)>;

  explicit FakeKregd(Script script)
      : path(listener_.path), script_(std::move(script)) {
    thread_ = std::thread([this] {
      int sock = ::accept4(listener_.fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (sock < 0) return;
      Peer peer(sock);
      script_(&peer);
      ::close(sock);
      requests = std::move(peer.requests);
      fd_sizes = std::move(peer.fd_sizes);
      fd_seals = std::move(peer.fd_seals);
    });
  }
  ~FakeKregd() { Join(); }
  // Waits for the script to end (a session never opened ends it too).
  void Join() {
    if (!thread_.joinable()) return;
    ::shutdown(listener_.fd, SHUT_RDWR);
    thread_.join();
  }

 private:
  // Declared before `path`, which is initialized from it.
  TempSessionSocket listener_{"/tmp/kreg-shim-conn.XXXXXX"};

 public:
  const std::string path;
  // What the script's Peer recorded; read after Join().
  std::vector<v1::SessionRequest> requests;
  std::vector<int64_t> fd_sizes;
  std::vector<int> fd_seals;

 private:
  Script script_;
  std::thread thread_;
};

}  // namespace kreg::shim

#endif  // KREGD_TESTS_CLIENT_SHIM_FAKE_KREGD_H_
