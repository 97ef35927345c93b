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

}  // namespace

int FindPlatform(std::string_view spelling) {
  for (size_t i = 0; i < kNumPlatforms; ++i) {
    const PlatformRow& row = kPlatforms[i];
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
  for (size_t i = 0; i < kNumPlatforms; ++i) {
    if (i > 0) out += i + 1 == kNumPlatforms ? " or " : ", ";
    out += "\"";
    out += kPlatforms[i].name;
    out += "\"";
    if (kPlatforms[i].alias != nullptr) {
      out += " (alias \"";
      out += kPlatforms[i].alias;
      out += "\")";
    }
  }
  return out;
}

}  // namespace kreg
