// A third platform, "fake" (alias "phony"), for the tests of the platform
// tables (docs/adding-a-platform.md): its buffers are host memory, its
// sources are built with the C++ compiler, it has neither an XLA FFI stream
// nor a thread pool, and its LaunchExecutor runs
// launches like the CPU one and counts them. It exists only in test
// binaries that call RegisterFakePlatform(): nothing outside these files
// knows it.
#ifndef KREGD_TESTS_DAEMON_FAKE_PLATFORM_FAKE_PLATFORM_H_
#define KREGD_TESTS_DAEMON_FAKE_PLATFORM_FAKE_PLATFORM_H_

#include <atomic>
#include <cstdint>
#include <vector>

#include "daemon/base/types.h"
#include "daemon/executor/launch_executor.h"

namespace kreg::testing {

class FakeExecutor final : public LaunchExecutor {
 public:
  explicit FakeExecutor(const SessionContext& ctx) : ctx_(ctx) {}

  absl::Status Launch(Request* request) override;
  void DescribeTo(v1::HelloReply* reply) const override;

  // Launches run by every FakeExecutor (socket, ring).
  static std::atomic<int> socket_launches;
  static std::atomic<int> ring_launches;

 private:
  absl::Status Run(uint64_t request_id, const DecodedLaunch& decoded);

  const SessionContext ctx_;
};

// Adds the fake platform's row to each platform table (common/platforms.h,
// daemon/base/platform_table.h, daemon/executor/platform_executors.h) on the
// first call; returns its Platform (index 2).
Platform RegisterFakePlatform();

}  // namespace kreg::testing

#endif  // KREGD_TESTS_DAEMON_FAKE_PLATFORM_FAKE_PLATFORM_H_
