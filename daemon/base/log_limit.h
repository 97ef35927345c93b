// Rate limits for log lines that a client can cause, so that no peer can
// flood kregd's log: per key (a peer's uid, a message's source), at most
// `burst` lines per window; the next line allowed after a suppression says
// how many were dropped. Thread-safe.
#ifndef KREGD_DAEMON_BASE_LOG_LIMIT_H_
#define KREGD_DAEMON_BASE_LOG_LIMIT_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace kreg {

class LogLimiter {
 public:
  using Clock = std::chrono::steady_clock;

  LogLimiter(int burst, Clock::duration window);
  LogLimiter(const LogLimiter&) = delete;
  LogLimiter& operator=(const LogLimiter&) = delete;

  // Sets *allowed to whether a line for `key` may be logged at `now`. When
  // it may and lines of `key` were dropped before it, returns a suffix for
  // the line: " (N similar lines suppressed in the last S s)"; else "".
  std::string Check(const std::string& key, Clock::time_point now,
                    bool* allowed);

  // Check(key, Clock::now(), &allowed).
  bool Allow(const std::string& key, std::string* suffix);

 private:
  struct Window {
    Clock::time_point start;
    int lines = 0;
    uint64_t dropped = 0;
  };
  const int burst_;
  const Clock::duration window_;
  absl::Mutex mu_;
  std::map<std::string, Window> windows_ ABSL_GUARDED_BY(mu_);
};

// The daemon-wide limiter for lines caused by one peer: key "uid N",
// 20 lines per 10 s each.
LogLimiter& PeerLogLimiter();

// Routes libprotobuf's own log messages (e.g. a parse error) into spdlog as
// warnings, at most 20 per 10 s per source line, instead of raw stderr.
void RouteProtobufLogs();

}  // namespace kreg

#endif  // KREGD_DAEMON_BASE_LOG_LIMIT_H_
