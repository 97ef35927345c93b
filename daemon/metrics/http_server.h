// kregd's Prometheus endpoint: a tiny HTTP/1.1 server on its own thread
// answering GET /metrics (404 for other paths, 405 for other methods).
// Everything that connects is untrusted: the request head is bounded
// (431), each connection has a deadline (408), and beyond a cap of
// concurrent connections new ones get 503 at once. One request per
// connection (Connection: close).
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
#include "common/unique_fd.h"
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
  // listen errors are INTERNAL/UNAVAILABLE with the address and errno text.
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
  MetricsServer(UniqueFd listen, std::string bound, std::string unlink_path,
                Render render, const MetricsServerOptions& options);
  void Loop();
  // Loop's parts: closes the connections past their deadline (a 408 to one
  // that had not sent its request) and returns poll's timeout for the
  // others (-1: none); accepts one connection, making room or refusing it
  // with 503 when max_connections are open.
  int Expire(std::list<Conn>* conns);
  void Accept(std::list<Conn>* conns);
  // Reads what is there; switches to writing once the head is complete or
  // refused. False: close now.
  bool OnReadable(Conn* c);
  // False: done or failed; close now.
  bool OnWritable(Conn* c);
  void Respond(Conn* c, int status, const std::string& body, bool head_only);

  UniqueFd listen_;
  UniqueFd wake_;
  const std::string bound_;
  const std::string unlink_path_;
  const Render render_;
  const MetricsServerOptions options_;
  std::thread thread_;
  bool stopped_ = false;
};

// "HTTP/1.1 <status> <reason>\r\n" plus headers and `body` (omitted for
// HEAD but counted in Content-Length). Exposed for tests.
std::string HttpResponse(int status, const std::string& body, bool head_only);

}  // namespace kreg

#endif  // KREGD_DAEMON_METRICS_HTTP_SERVER_H_
