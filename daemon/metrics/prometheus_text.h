// Writes the Prometheus text exposition format (version 0.0.4): one
// # HELP / # TYPE per metric family, then its samples. Label values are
// escaped (backslash, double quote, newline), so any target name is safe.
#ifndef KREGD_DAEMON_METRICS_PROMETHEUS_TEXT_H_
#define KREGD_DAEMON_METRICS_PROMETHEUS_TEXT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace kreg {

using PromLabels = std::vector<std::pair<std::string, std::string>>;

// `value` escaped for a label value (between the double quotes).
std::string EscapeLabelValue(absl::string_view value);
// `text` escaped for a HELP line.
std::string EscapeHelp(absl::string_view text);
// A sample value: integers exactly, others with enough digits; +Inf, -Inf
// and NaN as Prometheus spells them.
std::string PromNumber(double value);

// Builds one exposition. Not thread-safe. Families must be started before
// their samples; names are the caller's constants (not checked).
class PromWriter {
 public:
  // type: "counter", "gauge" or "histogram".
  void Family(absl::string_view name, absl::string_view type,
              absl::string_view help);
  void Sample(absl::string_view name, const PromLabels& labels, double value);
  void Sample(absl::string_view name, const PromLabels& labels, uint64_t value);
  const std::string& text() const { return out_; }

 private:
  void Head(absl::string_view name, const PromLabels& labels);
  std::string out_;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_METRICS_PROMETHEUS_TEXT_H_
