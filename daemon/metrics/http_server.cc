#include "daemon/metrics/http_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <list>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

int64_t NowMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
}

const char* ReasonPhrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 431:
      return "Request Header Fields Too Large";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Error";
  }
}

// How long a refused connection is kept to send its 503 and read the rest
// of its request (it holds no slot meanwhile; as many are kept as there are
// slots).
constexpr int64_t kRefusalLingerMs = 1000;

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", strerror(errno)));
}

absl::StatusOr<UniqueFd> BindUnix(const std::string& path, gid_t gid) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (::connect(probe.get(), reinterpret_cast<sockaddr*>(&addr),
                sizeof(addr)) == 0) {
    return absl::AlreadyExistsError(absl::StrCat(
        "metrics_listen unix:", path,
        ": another server answers there; stop it or choose another path"));
  }
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::AlreadyExistsError(
          absl::StrCat("metrics_listen unix:", path,
                       ": the path exists and is not a socket; remove it or "
                       "choose another path"));
    }
    ::unlink(path.c_str());  // a stale socket of a dead server
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.ok()) return Errno("metrics socket");
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Errno(absl::StrCat("cannot bind metrics_listen unix:", path));
  }
  if (::chmod(path.c_str(), 0660) != 0) return Errno("chmod metrics socket");
  if (gid != static_cast<gid_t>(-1) &&
      ::chown(path.c_str(), static_cast<uid_t>(-1), gid) != 0) {
    return Errno(absl::StrCat("cannot give ", path, " to gid ", gid));
  }
  return fd;
}

absl::StatusOr<UniqueFd> BindTcp(const MetricsAddress& a, uint16_t* port) {
  const bool v6 = a.kind == MetricsAddress::Kind::kTcp6;
  UniqueFd fd(::socket(v6 ? AF_INET6 : AF_INET,
                       SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.ok()) return Errno("metrics socket");
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_storage ss{};
  socklen_t len = 0;
  if (v6) {
    ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    auto* s6 = reinterpret_cast<sockaddr_in6*>(&ss);
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(a.port);
    inet_pton(AF_INET6, a.host.c_str(), &s6->sin6_addr);
    len = sizeof(*s6);
  } else {
    auto* s4 = reinterpret_cast<sockaddr_in*>(&ss);
    s4->sin_family = AF_INET;
    s4->sin_port = htons(a.port);
    inet_pton(AF_INET, a.host.c_str(), &s4->sin_addr);
    len = sizeof(*s4);
  }
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    return Errno(absl::StrCat("cannot bind metrics_listen ", a.ToString()));
  }
  len = sizeof(ss);
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len);
  *port = ntohs(v6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                   : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return fd;
}

}  // namespace

std::string HttpResponse(int status, const std::string& body, bool head_only) {
  std::string out =
      absl::StrCat("HTTP/1.1 ", status, " ", ReasonPhrase(status), "\r\n");
  if (status == 200) {
    out += "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n";
  } else {
    out += "Content-Type: text/plain; charset=utf-8\r\n";
  }
  if (status == 405) out += "Allow: GET, HEAD\r\n";
  absl::StrAppend(&out, "Content-Length: ", body.size(),
                  "\r\nConnection: close\r\n\r\n");
  if (!head_only) out += body;
  return out;
}

struct MetricsServer::Conn {
  UniqueFd fd;
  int64_t accepted_ms = 0;
  int64_t deadline_ms = 0;
  // Refused at accept (over the cap): holds no slot.
  bool refused = false;
  std::string in;
  std::string out;
  size_t sent = 0;
  bool writing = false;
  // Reply sent and our side shut down: the rest of the request is read and
  // dropped until the peer closes (closing with unread bytes would reset
  // the connection and could lose the reply), bounded.
  bool draining = false;
  size_t drained = 0;
};

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const MetricsAddress& address, Render render,
    const MetricsServerOptions& options) {
  absl::StatusOr<UniqueFd> fd;
  std::string bound;
  std::string unlink_path;
  if (address.kind == MetricsAddress::Kind::kUnix) {
    fd = BindUnix(address.path, options.socket_gid);
    bound = address.ToString();
    unlink_path = address.path;
  } else {
    uint16_t port = 0;
    fd = BindTcp(address, &port);
    MetricsAddress actual = address;
    actual.port = port;
    bound = actual.ToString();
  }
  if (!fd.ok()) return fd.status();
  if (::listen(fd->get(), 64) != 0) {
    return Errno(absl::StrCat("listen on metrics_listen ", bound));
  }
  return std::unique_ptr<MetricsServer>(
      new MetricsServer(*std::move(fd), std::move(bound),
                        std::move(unlink_path), std::move(render), options));
}

MetricsServer::MetricsServer(UniqueFd listen, std::string bound,
                             std::string unlink_path, Render render,
                             const MetricsServerOptions& options)
    : listen_(std::move(listen)),
      wake_(::eventfd(0, EFD_CLOEXEC)),
      bound_(std::move(bound)),
      unlink_path_(std::move(unlink_path)),
      render_(std::move(render)),
      options_(options) {
  thread_ = std::thread([this] { Loop(); });
}

MetricsServer::~MetricsServer() { Stop(); }

void MetricsServer::Stop() {
  if (stopped_) return;
  stopped_ = true;
  uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  listen_.reset();
  if (!unlink_path_.empty()) ::unlink(unlink_path_.c_str());
}

void MetricsServer::Respond(Conn* c, int status, const std::string& body,
                            bool head_only) {
  c->out = HttpResponse(status, body, head_only);
  c->sent = 0;
  c->writing = true;
}

bool MetricsServer::OnReadable(Conn* c) {
  char buf[4096];
  if (c->draining) {
    ssize_t n = ::recv(c->fd.get(), buf, sizeof(buf), 0);
    if (n < 0) return errno == EAGAIN || errno == EINTR;
    c->drained += static_cast<size_t>(n);
    return n > 0 && c->drained < (1u << 20);
  }
  const size_t room = options_.max_head_bytes + 1 - c->in.size();
  ssize_t n = ::recv(c->fd.get(), buf, std::min(sizeof(buf), room), 0);
  if (n < 0) return errno == EAGAIN || errno == EINTR;
  if (n == 0) return false;  // closed before a complete head
  c->in.append(buf, static_cast<size_t>(n));
  HttpHead head = ParseHttpHead(c->in, options_.max_head_bytes);
  if (head.state == HttpHead::State::kIncomplete) return true;
  if (head.state == HttpHead::State::kError) {
    Respond(c, head.status, head.reason + "\n", false);
    return true;
  }
  const int status = RouteMetricsRequest(head);
  const bool head_only = head.method == "HEAD";
  if (status == 200) {
    Respond(c, 200, render_(), head_only);
  } else if (status == 404) {
    Respond(c, 404, "kregd serves only /metrics here\n", head_only);
  } else {
    Respond(c, status, "only GET and HEAD are served\n", head_only);
  }
  return true;
}

bool MetricsServer::OnWritable(Conn* c) {
  while (c->sent < c->out.size()) {
    ssize_t n = ::send(c->fd.get(), c->out.data() + c->sent,
                       c->out.size() - c->sent, MSG_NOSIGNAL);
    if (n < 0) return errno == EAGAIN || errno == EINTR;
    c->sent += static_cast<size_t>(n);
  }
  ::shutdown(c->fd.get(), SHUT_WR);
  c->writing = false;
  c->draining = true;
  return true;
}

int MetricsServer::Expire(std::list<Conn>* conns) {
  const int64_t now = NowMs();
  int timeout = -1;
  for (auto it = conns->begin(); it != conns->end();) {
    if (now >= it->deadline_ms) {
      if (!it->writing && !it->draining && !it->refused) {
        // Best effort; the connection closes either way.
        std::string r =
            HttpResponse(408, "request not received in time\n", false);
        (void)!::send(it->fd.get(), r.data(), r.size(),
                      MSG_NOSIGNAL | MSG_DONTWAIT);
      }
      it = conns->erase(it);
      continue;
    }
    int64_t left = it->deadline_ms - now;
    timeout = timeout < 0 ? static_cast<int>(left)
                          : std::min<int>(timeout, static_cast<int>(left));
    ++it;
  }
  return timeout;
}

void MetricsServer::Accept(std::list<Conn>* conns) {
  UniqueFd fd(
      ::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  if (!fd.ok()) return;
  const int64_t now_ms = NowMs();
  int held = 0, refusing = 0;
  Conn* oldest_reader = nullptr;  // the slot a slow client holds longest
  for (Conn& c : *conns) {
    if (c.refused) {
      ++refusing;
      continue;
    }
    ++held;
    if (!c.writing && !c.draining &&
        (oldest_reader == nullptr ||
         c.accepted_ms < oldest_reader->accepted_ms)) {
      oldest_reader = &c;
    }
  }
  if (held >= options_.max_connections && oldest_reader != nullptr) {
    // Full, and some connections have not sent a whole request head: the
    // one that has had the longest makes room, told so with 503. A scraper
    // sends its head with the connection and is answered at once;
    // connections that keep slots by trickling bytes evict each other,
    // oldest first, and never a newer one that is being served.
    Respond(oldest_reader, 503,
            absl::StrCat("evicted: request head not complete after ",
                         now_ms - oldest_reader->accepted_ms, " ms while ",
                         options_.max_connections, " connections were open\n"),
            false);
    oldest_reader->refused = true;
    oldest_reader->deadline_ms = now_ms + kRefusalLingerMs;
    --held;
  }
  Conn c;
  c.fd = std::move(fd);
  c.accepted_ms = now_ms;
  c.deadline_ms = now_ms + options_.connection_timeout_ms;
  if (held >= options_.max_connections) {
    if (refusing >= options_.max_connections) return;  // closed here
    // The documented 503, sent whole: the request is read and dropped
    // (closing with it unread would reset the connection instead).
    Respond(&c, 503,
            absl::StrCat("more than ", options_.max_connections,
                         " concurrent metrics connections\n"),
            false);
    c.refused = true;
    c.deadline_ms = now_ms + kRefusalLingerMs;
    conns->push_back(std::move(c));
    OnWritable(&conns->back());
    return;
  }
  conns->push_back(std::move(c));
}

void MetricsServer::Loop() {
  std::list<Conn> conns;
  std::vector<pollfd> fds;
  std::vector<Conn*> owners;
  for (;;) {
    const int timeout = Expire(&conns);
    fds.clear();
    owners.clear();
    fds.push_back({wake_.get(), POLLIN, 0});
    fds.push_back({listen_.get(), POLLIN, 0});
    for (Conn& c : conns) {
      fds.push_back(
          {c.fd.get(), static_cast<short>(c.writing ? POLLOUT : POLLIN), 0});
      owners.push_back(&c);
    }
    int ready = ::poll(fds.data(), fds.size(), timeout);
    if (ready < 0) {
      if (errno == EINTR) continue;
      spdlog::error("metrics server: poll: {}", strerror(errno));
      return;
    }
    if (fds[0].revents != 0) return;
    for (size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Conn* c = owners[i - 2];
      bool keep = c->writing ? OnWritable(c) : OnReadable(c);
      if (keep && c->writing && c->sent == 0) keep = OnWritable(c);
      if (!keep) {
        conns.remove_if([c](const Conn& x) { return &x == c; });
      }
    }
    if (fds[1].revents & POLLIN) Accept(&conns);
  }
}

}  // namespace kreg
