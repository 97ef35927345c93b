// Limits of the broker protocol between an executor and kregd
// (proto/kreg/v1/executor.proto), shared by both sides.
#ifndef KREGD_DAEMON_BASE_BROKER_LIMITS_H_
#define KREGD_DAEMON_BASE_BROKER_LIMITS_H_

#include <cstdint>

namespace kreg {

// The largest BrokerRequest kregd reads from an executor. Executor -> kregd
// messages are small by design (names, a path, sizes: a registration is
// at most a few KiB; module bytes travel as a sealed memfd attached to the
// frame), and an executor runs untrusted kernels that can write into its
// broker sockets: a frame announcing more is refused before kregd allocates
// anything for it, and the session is disconnected.
constexpr uint32_t kMaxBrokerRequestBytes = 64u << 10;

}  // namespace kreg

#endif  // KREGD_DAEMON_BASE_BROKER_LIMITS_H_
