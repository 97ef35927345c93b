#include "daemon/base/log_limit.h"

#include <google/protobuf/stubs/logging.h>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

// Keys kept before windows that have ended are forgotten.
constexpr size_t kMaxKeys = 4096;

void ProtobufToSpdlog(google::protobuf::LogLevel level, const char* filename,
                      int line, const std::string& message) {
  static LogLimiter* limiter =
      new LogLimiter(20, std::chrono::seconds(10));  // never destroyed
  std::string suffix;
  if (!limiter->Allow(absl::StrCat(filename, ":", line), &suffix)) return;
  auto lvl = level >= google::protobuf::LOGLEVEL_ERROR ? spdlog::level::warn
                                                       : spdlog::level::info;
  spdlog::log(lvl, "libprotobuf {}:{}: {}{}", filename, line, message, suffix);
}

}  // namespace

LogLimiter::LogLimiter(int burst, Clock::duration window)
    : burst_(burst), window_(window) {}

std::string LogLimiter::Check(const std::string& key, Clock::time_point now,
                              bool* allowed) {
  absl::MutexLock lock(&mu_);
  if (windows_.size() >= kMaxKeys && windows_.count(key) == 0) {
    for (auto it = windows_.begin(); it != windows_.end();) {
      it = now - it->second.start >= window_ ? windows_.erase(it) : ++it;
    }
  }
  Window& w = windows_[key];
  std::string suffix;
  if (w.lines == 0 || now - w.start >= window_) {
    if (w.dropped > 0) {
      suffix = absl::StrCat(
          " (", w.dropped, " similar lines suppressed in the last ",
          std::chrono::duration_cast<std::chrono::seconds>(now - w.start)
              .count(),
          " s)");
    }
    w.start = now;
    w.lines = 0;
    w.dropped = 0;
  }
  *allowed = w.lines < burst_;
  if (*allowed) {
    ++w.lines;
  } else {
    ++w.dropped;
    suffix.clear();
  }
  return suffix;
}

bool LogLimiter::Allow(const std::string& key, std::string* suffix) {
  bool allowed = false;
  *suffix = Check(key, Clock::now(), &allowed);
  return allowed;
}

LogLimiter& PeerLogLimiter() {
  static LogLimiter* limiter = new LogLimiter(20, std::chrono::seconds(10));
  return *limiter;
}

void RouteProtobufLogs() { google::protobuf::SetLogHandler(&ProtobufToSpdlog); }

}  // namespace kreg
