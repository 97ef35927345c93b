#include "daemon/metrics/http_server.h"

#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/ip/v6_only.hpp"
#include "boost/asio/local/stream_protocol.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/write.hpp"
#include "common/status_macros.h"
#include "common/unique_fd.h"
#include "daemon/base/unix_listener.h"

namespace kreg {
namespace {

namespace asio = boost::asio;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;

// How long a refused connection is kept to send its 503 and read the rest
// of its request (it holds no slot meanwhile; as many are kept as there are
// slots).
constexpr int64_t kRefusalLingerMs = 1000;

// What the rest of a request may be once it is answered: read and dropped
// until the peer closes (closing with unread bytes would reset the
// connection and could lose the reply), up to this much.
constexpr size_t kMaxDrainBytes = 1 << 20;

absl::Status Unavailable(absl::string_view what, int err) {
  return absl::UnavailableError(absl::StrCat(what, ": ", strerror(err)));
}

}  // namespace

struct MetricsServer::Conn {
  explicit Conn(asio::io_context& io) : sock(io), timer(io) {}
  asio::generic::stream_protocol::socket sock;
  asio::steady_timer timer;
  const Clock::time_point accepted = Clock::now();
  bool refused = false;     // over the cap or evicted: holds no slot
  bool answered = false;    // the reply is out or on its way; reads drain
  bool writing = false;     // the reply is on its way
  bool read_ended = false;  // the peer closed (or failed) while writing
  std::string in;           // the request head so far
  std::string out;
  std::array<char, 4096> buf;
  size_t drained = 0;
};

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const MetricsAddress& address, Render render,
    const MetricsServerOptions& options) {
  std::unique_ptr<MetricsServer> server(
      new MetricsServer(std::move(render), options));
  KREG_RETURN_IF_ERROR(server->Listen(address));
  server->Accept();
  server->thread_ = std::thread([s = server.get()] { s->io_.run(); });
  return std::move(server);
}

MetricsServer::MetricsServer(Render render, const MetricsServerOptions& options)
    : render_(std::move(render)), options_(options) {}

MetricsServer::~MetricsServer() { Stop(); }

absl::Status MetricsServer::Listen(const MetricsAddress& a) {
  const bool unix = a.kind == MetricsAddress::Kind::kUnix;
  error_code ec;
  asio::generic::stream_protocol::endpoint ep;
  if (unix) {
    asio::local::stream_protocol::endpoint unix_ep(a.path);
    UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (::connect(probe.get(), unix_ep.data(), unix_ep.size()) == 0) {
      return absl::AlreadyExistsError(absl::StrCat(
          "metrics_listen unix:", a.path,
          ": another server answers there; stop it or choose another path"));
    }
    struct stat st;
    if (::lstat(a.path.c_str(), &st) == 0) {
      if (!S_ISSOCK(st.st_mode)) {
        return absl::AlreadyExistsError(
            absl::StrCat("metrics_listen unix:", a.path,
                         ": the path exists and is not a socket; remove it or "
                         "choose another path"));
      }
      ::unlink(a.path.c_str());  // a stale socket of a dead server
    }
    ep = unix_ep;
  } else {
    ep = asio::ip::tcp::endpoint(asio::ip::make_address(a.host, ec), a.port);
  }
  // Asio's sockets are inheritable; kregd spawns processes.
  protocol_ = ep.protocol();
  UniqueFd fd(::socket(protocol_.family(),
                       SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.ok()) return Unavailable("metrics socket", errno);
  if (acceptor_.assign(protocol_, fd.get(), ec)) {
    return Unavailable("metrics socket", ec.value());
  }
  fd.release();
  if (!unix) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (a.kind == MetricsAddress::Kind::kTcp6) {
    acceptor_.set_option(asio::ip::v6_only(true), ec);
  }
  bound_ = a.ToString();
  if (acceptor_.bind(ep, ec)) {
    return Unavailable(absl::StrCat("cannot bind metrics_listen ", bound_),
                       ec.value());
  }
  if (unix) {
    unlink_path_ = a.path;
    if (::chmod(a.path.c_str(), 0660) != 0) {
      return Unavailable("chmod metrics socket", errno);
    }
    if (options_.socket_gid != static_cast<gid_t>(-1) &&
        ::chown(a.path.c_str(), static_cast<uid_t>(-1), options_.socket_gid) !=
            0) {
      return Unavailable(
          absl::StrCat("cannot give ", a.path, " to gid ", options_.socket_gid),
          errno);
    }
  } else {
    // sin_port and sin6_port lie at the same offset.
    MetricsAddress actual = a;
    actual.port = ntohs(reinterpret_cast<const sockaddr_in*>(
                            acceptor_.local_endpoint(ec).data())
                            ->sin_port);
    bound_ = actual.ToString();
  }
  if (acceptor_.listen(64, ec)) {
    return Unavailable(absl::StrCat("listen on metrics_listen ", bound_),
                       ec.value());
  }
  return absl::OkStatus();
}

void MetricsServer::Stop() {
  if (stopped_) return;
  stopped_ = true;
  io_.stop();
  if (thread_.joinable()) thread_.join();
  error_code ignored;
  acceptor_.close(ignored);
  for (const ConnPtr& c : conns_) c->sock.close(ignored);
  conns_.clear();
  if (!unlink_path_.empty()) ::unlink(unlink_path_.c_str());
}

void MetricsServer::Accept() {
  acceptor_.async_wait(asio::socket_base::wait_read, [this](error_code ec) {
    if (ec == asio::error::operation_aborted) return;
    // accept4: close-on-exec from the start, unlike Asio's accept.
    UniqueFd fd(::accept4(acceptor_.native_handle(), nullptr, nullptr,
                          SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd.ok()) {
      // Out of descriptors: the connection stays queued, so wait before
      // trying it again instead of spinning.
      accept_pause_.expires_after(AcceptFailed("metrics socket", errno));
      accept_pause_.async_wait([this](error_code ec) {
        if (ec != asio::error::operation_aborted) Accept();
      });
      return;
    }
    auto c = std::make_shared<Conn>(io_);
    if (!c->sock.assign(protocol_, fd.get(), ec)) {
      fd.release();
      Admit(c);
    }
    Accept();
  });
}

void MetricsServer::Admit(const ConnPtr& c) {
  int held = 0, refusing = 0;
  ConnPtr oldest_reader;  // the slot a slow client holds longest
  for (const ConnPtr& o : conns_) {
    if (o->refused) {
      ++refusing;
      continue;
    }
    ++held;
    if (!o->answered && oldest_reader == nullptr) oldest_reader = o;
  }
  const int max = options_.max_connections;
  if (held >= max && oldest_reader != nullptr) {
    // Full, and some connections have not sent a whole request head: the
    // one that has had the longest makes room, told so with 503. A scraper
    // sends its head with the connection and is answered at once;
    // connections that keep slots by trickling bytes evict each other,
    // oldest first, and never a newer one that is being served.
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
        c->accepted - oldest_reader->accepted);
    oldest_reader->refused = true;
    Reply(oldest_reader,
          HttpResponse(503,
                       absl::StrCat("evicted: request head not complete after ",
                                    waited.count(), " ms while ", max,
                                    " connections were open\n"),
                       false));
    CloseAt(oldest_reader, kRefusalLingerMs);
    --held;
  }
  if (held >= max && refusing >= max) return;  // closed here
  conns_.push_back(c);
  if (held >= max) {
    // The documented 503, sent whole: the request is read and dropped
    // (closing with it unread would reset the connection instead).
    c->refused = true;
    Reply(c, HttpResponse(503,
                          absl::StrCat("more than ", max,
                                       " concurrent metrics connections\n"),
                          false));
    CloseAt(c, kRefusalLingerMs);
  } else {
    CloseAt(c, options_.connection_timeout_ms);
  }
  Read(c);
}

void MetricsServer::Read(const ConnPtr& c) {
  // Never more than the head limit before an answer: Beast has answered
  // by then.
  const size_t room =
      c->answered
          ? c->buf.size()
          : std::min(c->buf.size(), options_.max_head_bytes - c->in.size());
  c->sock.async_read_some(
      asio::buffer(c->buf.data(), room), [this, c](error_code ec, size_t n) {
        if (ec) {
          // The peer's end (or ours): the reply being written still goes.
          if (!c->writing) return Close(c);
          c->read_ended = true;
          return;
        }
        if (c->answered) {
          c->drained += n;
          if (c->drained >= kMaxDrainBytes) return Close(c);
        } else {
          c->in.append(c->buf.data(), n);
          std::optional<std::string> reply =
              AnswerMetricsRequest(c->in, options_.max_head_bytes, render_);
          if (reply.has_value()) Reply(c, *std::move(reply));
        }
        Read(c);
      });
}

void MetricsServer::Reply(const ConnPtr& c, std::string response) {
  c->answered = c->writing = true;
  c->out = std::move(response);
  asio::async_write(c->sock, asio::buffer(c->out),
                    [this, c](error_code ec, size_t) {
                      c->writing = false;
                      if (ec || c->read_ended) return Close(c);
                      c->sock.shutdown(asio::socket_base::shutdown_send, ec);
                    });
}

void MetricsServer::CloseAt(const ConnPtr& c, int64_t ms_from_now) {
  c->timer.expires_after(std::chrono::milliseconds(ms_from_now));
  c->timer.async_wait([this, c](error_code ec) {
    // Cancelled, or fired just before it was set again: not this deadline.
    if (ec || c->timer.expiry() > Clock::now()) return;
    if (!c->answered) {
      // Best effort; the connection closes either way.
      c->sock.non_blocking(true, ec);
      c->sock.write_some(asio::buffer(HttpResponse(
                             408, "request not received in time\n", false)),
                         ec);
    }
    Close(c);
  });
}

void MetricsServer::Close(const ConnPtr& c) {
  error_code ignored;
  c->sock.close(ignored);
  c->timer.cancel();
  conns_.remove(c);
}

}  // namespace kreg
