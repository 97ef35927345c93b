// The fetch tree of a module (daemon/cluster/fetch_tree.h,
// docs/operator-guide.md "Sizing"): every host computes the same tree from
// the same hosts, the origin serves at most kFetchRootFanOut hosts and any
// other at most kFetchFanOut, and which hosts serve differs from module to
// module.
#include "daemon/cluster/fetch_tree.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"

namespace kreg {
namespace {

std::vector<std::string> Hosts(int n) {
  std::vector<std::string> hosts;
  for (int i = 0; i < n; ++i)
    hosts.push_back(absl::StrCat("127.0.1.", i, ":7100"));
  return hosts;
}

std::string Digest(int i) {
  std::string d = absl::StrCat("sha256:", i);
  d.resize(71, '0');
  return d;
}

// parent -> how many hosts fetch from it, for module `digest` from `origin`.
std::map<std::string, int> Children(const std::string& digest,
                                    const std::string& origin,
                                    const std::vector<std::string>& hosts) {
  std::map<std::string, int> children;
  for (const std::string& h : hosts) {
    std::vector<std::string> chain = FetchChain(digest, origin, h, hosts);
    if (h == origin) {
      CHECK(chain.empty());
      continue;
    }
    REQUIRE(!chain.empty());
    CHECK(chain.back() == origin);
    CHECK(std::find(chain.begin(), chain.end(), h) == chain.end());
    ++children[chain[0]];
  }
  return children;
}

TEST_CASE("FetchChain: no chain for the origin or without one", "[fetch]") {
  const std::vector<std::string> hosts = Hosts(8);
  CHECK(FetchChain(Digest(1), hosts[0], hosts[0], hosts).empty());
  CHECK(FetchChain(Digest(1), "", hosts[1], hosts).empty());
  // Alone with the origin: the origin is the parent.
  CHECK(FetchChain(Digest(1), hosts[0], hosts[1], {}) ==
        std::vector<std::string>{hosts[0]});
}

TEST_CASE("FetchChain: a tree of fan-out 1 at the origin, 4 below", "[fetch]") {
  for (int n : {2, 3, 8, 16, 64, 256}) {
    const std::vector<std::string> hosts = Hosts(n);
    for (int m = 0; m < 20; ++m) {
      const std::string origin = hosts[m % n];
      std::map<std::string, int> children = Children(Digest(m), origin, hosts);
      int fetchers = 0;
      for (const auto& [parent, count] : children) {
        CHECK(count <= (parent == origin ? kFetchRootFanOut : kFetchFanOut));
        fetchers += count;
      }
      CHECK(fetchers == n - 1);
      CHECK(children[origin] == std::min(n - 1, kFetchRootFanOut));
    }
    // Depth: 64 hosts are within 4 levels of the origin (1 + 4 + 16 + 64).
    if (n == 64) {
      size_t deepest = 0;
      for (const std::string& h : hosts) {
        deepest =
            std::max(deepest, FetchChain(Digest(7), hosts[0], h, hosts).size());
      }
      CHECK(deepest == 4);
    }
  }
}

TEST_CASE("FetchChain: every host computes the same tree", "[fetch]") {
  const std::vector<std::string> hosts = Hosts(64);
  std::vector<std::string> reversed(hosts.rbegin(), hosts.rend());
  std::vector<std::string> doubled = hosts;
  doubled.insert(doubled.end(), hosts.begin(), hosts.end());
  std::vector<std::string> without_self(hosts.begin() + 1, hosts.end());
  for (int i = 1; i < 64; ++i) {
    const auto chain = FetchChain(Digest(3), hosts[0], hosts[i], hosts);
    CHECK(FetchChain(Digest(3), hosts[0], hosts[i], reversed) == chain);
    CHECK(FetchChain(Digest(3), hosts[0], hosts[i], doubled) == chain);
  }
  // `self` and `origin` need not be among `hosts`.
  std::vector<std::string> others(hosts.begin() + 2, hosts.end());
  CHECK(FetchChain(Digest(3), hosts[0], hosts[1], others) ==
        FetchChain(Digest(3), hosts[0], hosts[1], hosts));
}

TEST_CASE("FetchChain: the serving spreads over the hosts across modules",
          "[fetch]") {
  // A job start's worst case: one host registers all 50 targets first and
  // the 63 others fetch every module.
  const std::vector<std::string> hosts = Hosts(64);
  std::map<std::string, int> served;
  for (int m = 0; m < 50; ++m) {
    for (const auto& [parent, count] : Children(Digest(m), hosts[0], hosts)) {
      served[parent] += count;
    }
  }
  const double mean = 63.0 * 50 / 64;
  int busiest = 0;
  for (const auto& [host, count] : served) busiest = std::max(busiest, count);
  CHECK(served[hosts[0]] == 50 * kFetchRootFanOut);
  CHECK(busiest <= 4 * mean);
  // Some 16 of the 63 serve each module (1 + 4 + 11 parents): nearly every
  // host serves some.
  CHECK(served.size() >= 60);
}

}  // namespace
}  // namespace kreg
