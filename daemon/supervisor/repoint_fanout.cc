#include "daemon/supervisor/repoint_fanout.h"

#include <algorithm>
#include <thread>

namespace kreg {

std::vector<Repointer::Laggard> RepointFanout::Repoint(const TargetEntry& entry,
                                                       absl::Time deadline) {
  std::vector<std::vector<Laggard>> found(parts_.size());
  std::vector<std::thread> threads;
  for (size_t i = 1; i < parts_.size(); ++i) {
    threads.emplace_back(
        [&, i] { found[i] = parts_[i]->Repoint(entry, deadline); });
  }
  if (!parts_.empty()) found[0] = parts_[0]->Repoint(entry, deadline);
  for (std::thread& t : threads) t.join();
  std::vector<Laggard> out;
  for (std::vector<Laggard>& part : found) {
    out.insert(out.end(), part.begin(), part.end());
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Laggard& a, const Laggard& b) {
                     return a.peer.pid < b.peer.pid;
                   });
  return out;
}

}  // namespace kreg
