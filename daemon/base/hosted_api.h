// The XLA FFI API version kregd hosts, for code that checks handlers
// against it (the module loader, status) without linking FfiHost, which only
// executors run (DESIGN §8).
#ifndef KREGD_DAEMON_BASE_HOSTED_API_H_
#define KREGD_DAEMON_BASE_HOSTED_API_H_

#include "xla/ffi/api/c_api.h"

namespace kreg {

// That of the XLA FFI headers kregd is built with (jaxlib 0.11.2: 0.4).
inline constexpr int kHostedApiMajor = XLA_FFI_API_MAJOR;
inline constexpr int kHostedApiMinor = XLA_FFI_API_MINOR;

}  // namespace kreg

#endif  // KREGD_DAEMON_BASE_HOSTED_API_H_
