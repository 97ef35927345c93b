#include "daemon/metrics/prometheus_text.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace kreg {

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeHelp(absl::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string PromNumber(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  // The shortest of 15 or 17 significant digits that reads back exactly.
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.15g", value);
  if (std::strtod(buf, nullptr) != value) {
    std::snprintf(buf, sizeof(buf), "%.17g", value);
  }
  return buf;
}

void PromWriter::Family(absl::string_view name, absl::string_view type,
                        absl::string_view help) {
  absl::StrAppend(&out_, "# HELP ", name, " ", EscapeHelp(help), "\n",
                  "# TYPE ", name, " ", type, "\n");
}

void PromWriter::Head(absl::string_view name, const PromLabels& labels) {
  out_.append(name.data(), name.size());
  if (labels.empty()) return;
  out_ += '{';
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i > 0) out_ += ',';
    absl::StrAppend(&out_, labels[i].first, "=\"",
                    EscapeLabelValue(labels[i].second), "\"");
  }
  out_ += '}';
}

void PromWriter::Sample(absl::string_view name, const PromLabels& labels,
                        double value) {
  Head(name, labels);
  absl::StrAppend(&out_, " ", PromNumber(value), "\n");
}

void PromWriter::Sample(absl::string_view name, const PromLabels& labels,
                        uint64_t value) {
  Head(name, labels);
  absl::StrAppend(&out_, " ", value, "\n");
}

}  // namespace kreg
