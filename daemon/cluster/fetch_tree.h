// Which peer a host fetches a new module from when every host lacks it at
// once (a job start, a new binding seen by all hosts together): the hosts
// form a tree per module, rooted at the binding's host, so that the module
// spreads host to host instead of every host reading it from the one that
// registered it (docs/operator-guide.md "Sizing").
#ifndef KREGD_DAEMON_CLUSTER_FETCH_TREE_H_
#define KREGD_DAEMON_CLUSTER_FETCH_TREE_H_

#include <string>
#include <vector>

namespace kreg {

// The root serves this many hosts directly (at a job start it is the same
// host for most targets, the one that registered them first: its share
// must stay small); every other host of the tree serves at most
// kFetchFanOut (ModuleExchangeService::kMaxServing at once; the tree is 4
// levels deep at 64 hosts: 1 + 4 + 16 + 64).
inline constexpr int kFetchRootFanOut = 1;
inline constexpr int kFetchFanOut = 4;

// The ancestors of `self` in the fetch tree of module `digest` whose root
// is `origin`, nearest first and ending at `origin` (empty when `self` is
// the origin or `origin` is empty). The tree's other members are `hosts`
// (addresses; `self` and `origin` among them or not, duplicates ignored),
// placed in the order of a hash of (digest, address): every host that
// knows the same hosts computes the same tree, and a host's place differs
// from module to module, so which hosts serve is spread over the modules.
std::vector<std::string> FetchChain(const std::string& digest,
                                    const std::string& origin,
                                    const std::string& self,
                                    const std::vector<std::string>& hosts);

}  // namespace kreg

#endif  // KREGD_DAEMON_CLUSTER_FETCH_TREE_H_
