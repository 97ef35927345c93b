#include "common/platforms.h"

#include <cctype>

namespace kreg {
namespace {

bool SameIgnoringCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

constexpr size_t kMaxPlatforms = 8;
PlatformRows<PlatformRow, kMaxPlatforms - kNumPlatforms> g_rows(kPlatforms);

}  // namespace

size_t NumPlatforms() { return g_rows.size(); }

const PlatformRow& PlatformAt(size_t index) { return g_rows[index]; }

int AddPlatformForTest(const PlatformRow& row) {
  if (FindPlatform(row.name) >= 0 ||
      (row.alias != nullptr && FindPlatform(row.alias) >= 0) ||
      !g_rows.Add(row)) {
    return -1;
  }
  return static_cast<int>(NumPlatforms() - 1);
}

int FindPlatform(std::string_view spelling) {
  for (size_t i = 0; i < NumPlatforms(); ++i) {
    const PlatformRow& row = PlatformAt(i);
    if (SameIgnoringCase(spelling, row.name) ||
        (row.alias != nullptr && SameIgnoringCase(spelling, row.alias))) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

bool IsUnservedPlatform(std::string_view spelling) {
  for (const char* p : kUnservedPlatforms) {
    if (SameIgnoringCase(spelling, p)) return true;
  }
  return false;
}

std::string PlatformChoices() {
  std::string out;
  const size_t n = NumPlatforms();
  for (size_t i = 0; i < n; ++i) {
    const PlatformRow& row = PlatformAt(i);
    if (i > 0) out += i + 1 == n ? " or " : ", ";
    out += "\"";
    out += row.name;
    out += "\"";
    if (row.alias != nullptr) {
      out += " (alias \"";
      out += row.alias;
      out += "\")";
    }
  }
  return out;
}

}  // namespace kreg
