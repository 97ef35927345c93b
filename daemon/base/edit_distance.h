// Edit distance for "did you mean" suggestions (config keys, handler
// symbol names).
#ifndef KREGD_DAEMON_BASE_EDIT_DISTANCE_H_
#define KREGD_DAEMON_BASE_EDIT_DISTANCE_H_

#include <cstddef>

#include "absl/strings/string_view.h"

namespace kreg {

// Case-insensitive Levenshtein distance between `a` and `b`.
size_t EditDistance(absl::string_view a, absl::string_view b);

}  // namespace kreg

#endif  // KREGD_DAEMON_BASE_EDIT_DISTANCE_H_
