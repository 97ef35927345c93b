#include "daemon/base/log_format.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "spdlog/pattern_formatter.h"
#include "spdlog/spdlog.h"

namespace kreg {
namespace {

// "%*": the sd-daemon priority prefix of the message's level.
class PriorityFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    // trace, debug, info, warn, err, critical, off
    static constexpr char kPrefix[][4] = {"<7>", "<7>", "<6>", "<4>",
                                          "<3>", "<2>", "<6>"};
    const int level = static_cast<int>(msg.level);
    const char* p = kPrefix[level >= 0 && level < 7 ? level : 2];
    dest.append(p, p + 3);
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<PriorityFlag>();
  }
};

}  // namespace

bool StderrIsJournal() {
  const char* stream = std::getenv("JOURNAL_STREAM");
  if (stream == nullptr) return false;
  unsigned long long dev = 0, ino = 0;  // NOLINT(runtime/int): sscanf's
  if (std::sscanf(stream, "%llu:%llu", &dev, &ino) != 2) return false;
  struct stat st;
  if (::fstat(2, &st) != 0) return false;
  return static_cast<unsigned long long>(st.st_dev) == dev &&  // NOLINT
         static_cast<unsigned long long>(st.st_ino) == ino;    // NOLINT
}

void SetLogFormat(const std::string& ident, const std::string& suffix) {
  // UTC with a Z, as kregctl prints times.
  auto formatter = std::make_unique<spdlog::pattern_formatter>(
      spdlog::pattern_time_type::utc);
  if (StderrIsJournal()) {
    formatter->add_flag<PriorityFlag>('*').set_pattern("%*%l " + ident +
                                                       "[%P]" + suffix + " %v");
  } else {
    formatter->set_pattern("%Y-%m-%dT%H:%M:%S.%eZ %^%l%$ " + ident + "[%P]" +
                           suffix + " %v");
  }
  spdlog::set_formatter(std::move(formatter));
}

}  // namespace kreg
