#include "daemon/base/types.h"

#include <grp.h>
#include <pwd.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/platforms.h"

namespace kreg {

const char* PlatformName(Platform platform) {
  const size_t i = static_cast<size_t>(platform);
  return i < NumPlatforms() ? PlatformAt(i).name : "?";
}

std::string Named(const TargetKey& key) {
  return "target \"" + key.name + "\" (" + PlatformName(key.platform) + ")";
}

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool NameReservation::Matches(const std::string& name) const {
  if (!pattern.empty() && pattern.back() == '*') {
    return name.compare(0, pattern.size() - 1, pattern, 0,
                        pattern.size() - 1) == 0;
  }
  return name == pattern;
}

std::string UserName(uid_t uid) {
  char buf[4096];
  struct passwd pw;
  struct passwd* found = nullptr;
  const bool named =
      ::getpwuid_r(uid, &pw, buf, sizeof(buf), &found) == 0 && found;
  return absl::StrCat("uid ", uid,
                      named ? absl::StrCat(" (", found->pw_name, ")") : "");
}

std::vector<gid_t> GroupsOf(uid_t uid, gid_t gid) {
  std::vector<char> buf(16384);
  struct passwd pw;
  struct passwd* found = nullptr;
  if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) != 0 ||
      found == nullptr) {
    return {gid};
  }
  int n = 64;
  std::vector<gid_t> groups(n);
  while (::getgrouplist(pw.pw_name, gid, groups.data(), &n) < 0) {
    groups.resize(n + 16);
    n = static_cast<int>(groups.size());
  }
  groups.resize(n);
  return groups;
}

std::string OwnerName(const NameReservation& r) {
  if (!r.group) return UserName(r.owner);
  char buf[4096];
  struct group gr;
  struct group* found = nullptr;
  const bool named =
      ::getgrgid_r(r.owner, &gr, buf, sizeof(buf), &found) == 0 && found;
  return absl::StrCat("group ", r.owner,
                      named ? absl::StrCat(" (", found->gr_name, ")") : "");
}

const char* TargetKindName(TargetKind kind) {
  return kind == TargetKind::kInProcess ? "in-process" : "module";
}

}  // namespace kreg
