#include "daemon/cluster/fetch_tree.h"

#include <algorithm>
#include <cstdint>
#include <utility>

namespace kreg {
namespace {

// FNV-1a, then a final mix: stable across hosts and builds (every host
// must compute the same order).
uint64_t PlaceHash(const std::string& digest, const std::string& address) {
  uint64_t h = 0xcbf29ce484222325ull;
  auto add = [&h](const std::string& s) {
    for (unsigned char c : s) {
      h ^= c;
      h *= 0x100000001b3ull;
    }
  };
  add(digest);
  h ^= 0xff;
  h *= 0x100000001b3ull;
  add(address);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

}  // namespace

std::vector<std::string> FetchChain(const std::string& digest,
                                    const std::string& origin,
                                    const std::string& self,
                                    const std::vector<std::string>& hosts) {
  if (origin.empty() || self == origin) return {};
  std::vector<std::pair<uint64_t, std::string>> placed;
  placed.reserve(hosts.size() + 1);
  auto add = [&](const std::string& a) {
    if (!a.empty() && a != origin) placed.emplace_back(PlaceHash(digest, a), a);
  };
  for (const std::string& a : hosts) add(a);
  add(self);
  std::sort(placed.begin(), placed.end());
  placed.erase(std::unique(placed.begin(), placed.end()), placed.end());
  // Place 0 is the origin; places 1..r are its children; place p > r is a
  // child of place (p - r - 1) / k + 1.
  size_t p = 0;
  while (p < placed.size() && placed[p].second != self) ++p;
  p += 1;
  std::vector<std::string> chain;
  while (p > 0) {
    p = p <= static_cast<size_t>(kFetchRootFanOut)
            ? 0
            : (p - kFetchRootFanOut - 1) / kFetchFanOut + 1;
    chain.push_back(p == 0 ? origin : placed[p - 1].second);
  }
  return chain;
}

}  // namespace kreg
