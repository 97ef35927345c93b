#include "common/generations.h"

namespace kreg {

std::string NoSuchGeneration(const std::string& name,
                             const std::string& platform, uint32_t generation,
                             const std::vector<uint32_t>& have) {
  std::string out = "target \"" + name + "\" (" + platform +
                    ") has no generation " + std::to_string(generation);
  if (have.empty()) {
    return out +
           ": it is not registered (retiring a target removes all its "
           "generations). Register it, or check the name with `kregctl list`";
  }
  out += ": its generations are ";
  for (size_t i = 0; i < have.size(); ++i) {
    out += (i == 0 ? "" : ", ") + std::to_string(have[i]);
  }
  return out + " (the current one is " + std::to_string(have.back()) +
         "). Pin one of these, or bind without a generation to follow the "
         "current one; `kregctl show " +
         name + "` lists them";
}

}  // namespace kreg
