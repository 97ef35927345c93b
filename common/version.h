// The one version string of kregd, kregctl and the kreg wheel
// (client/python/pyproject.toml and kreg.__version__ must match it; a test
// checks that they do).
#ifndef KREGD_COMMON_VERSION_H_
#define KREGD_COMMON_VERSION_H_

namespace kreg {

inline constexpr char kKregVersion[] = "0.1.0";

}  // namespace kreg

#endif  // KREGD_COMMON_VERSION_H_
