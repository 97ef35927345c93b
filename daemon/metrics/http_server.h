// kregd's Prometheus endpoint: a tiny HTTP/1.1 server (Boost.Asio) on its
// own thread answering GET /metrics (404 for other paths, 405 for other
// methods). Everything that connects is untrusted: the request head is
// bounded (431), each connection has an absolute deadline (408), and
// beyond a cap of concurrent connections new ones get 503 at once. One
// request per connection (Connection: close).
#ifndef KREGD_DAEMON_METRICS_HTTP_SERVER_H_
#define KREGD_DAEMON_METRICS_HTTP_SERVER_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "boost/asio/basic_socket_acceptor.hpp"
#include "boost/asio/generic/stream_protocol.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/steady_timer.hpp"
#include "daemon/metrics/http_request.h"
#include "daemon/metrics/listen_address.h"

namespace kreg {

struct MetricsServerOptions {
  int max_connections = 16;
  // From accept to the last byte of the reply.
  int64_t connection_timeout_ms = 5000;
  size_t max_head_bytes = kMaxHttpHeadBytes;
  // Group of a unix: socket file (mode 0660) unless -1.
  gid_t socket_gid = static_cast<gid_t>(-1);
};

// Owns the listening socket (and a unix: socket file it created), the
// server thread and its connections. Start/Stop from one thread; `render`
// is called on the server thread for each GET /metrics and must be
// thread-safe with respect to the rest of the daemon.
class MetricsServer {
 public:
  using Render = std::function<std::string()>;

  // Binds `address` and starts serving. A unix: path where a server
  // answers is ALREADY_EXISTS; a stale socket file is replaced; bind and
  // listen errors are UNAVAILABLE with the address and errno text.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const MetricsAddress& address, Render render,
      const MetricsServerOptions& options = {});
  ~MetricsServer();  // Stop()
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Stops the thread, closes every connection and the socket (and removes
  // its socket file). Idempotent.
  void Stop();
  // Where it listens, with the port the kernel chose for port 0.
  const std::string& address() const { return bound_; }

 private:
  struct Conn;
  using ConnPtr = std::shared_ptr<Conn>;
  MetricsServer(Render render, const MetricsServerOptions& options);
  absl::Status Listen(const MetricsAddress& address);
  // The server thread's chain of handlers: accepts; admits a connection
  // (making room by evicting the one that has waited longest for its
  // request head, or refusing it with 503 when every slot is busy); reads
  // the head and then drains the rest; replies; closes at the deadline (a
  // 408 to one that had not sent its request) or when done.
  void Accept();
  void Admit(const ConnPtr& c);
  void Read(const ConnPtr& c);
  void Reply(const ConnPtr& c, std::string response);
  void CloseAt(const ConnPtr& c, int64_t ms_from_now);
  void Close(const ConnPtr& c);

  const Render render_;
  const MetricsServerOptions options_;
  boost::asio::io_context io_;
  boost::asio::basic_socket_acceptor<boost::asio::generic::stream_protocol>
      acceptor_{io_};
  boost::asio::generic::stream_protocol protocol_{AF_UNIX, 0};  // acceptor_'s
  boost::asio::steady_timer accept_pause_{io_};  // out of descriptors
  std::list<ConnPtr> conns_;  // accept order; the server thread's
  std::string bound_;
  std::string unlink_path_;
  std::thread thread_;
  bool stopped_ = false;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_METRICS_HTTP_SERVER_H_
