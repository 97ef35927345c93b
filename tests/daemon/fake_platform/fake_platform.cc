#include "tests/daemon/fake_platform/fake_platform.h"

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/platforms.h"
#include "daemon/base/platform_table.h"
#include "daemon/executor/platform_executors.h"
#include "daemon/executor/session.h"

namespace kreg::testing {

std::atomic<int> FakeExecutor::socket_launches{0};
std::atomic<int> FakeExecutor::ring_launches{0};

absl::Status FakeExecutor::Launch(Request* request) {
  if (request->socket != nullptr && !request->socket->fds.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        request->socket->fds.size(), " file descriptor(s) attached"));
  }
  absl::StatusOr<DecodedLaunch*> decoded = request->decode(nullptr);
  if (!decoded.ok()) return decoded.status();
  ++(request->socket != nullptr ? socket_launches : ring_launches);
  return Run(request->id, **decoded);
}

void FakeExecutor::DescribeTo(v1::HelloReply* reply) const {
  (void)reply;  // nothing to tell a client
}

absl::Status FakeExecutor::Run(uint64_t request_id,
                               const DecodedLaunch& decoded) {
  absl::StatusOr<ResolvedHandler> handler =
      ctx_.handlers->Lookup(decoded.key, decoded.generation);
  if (!handler.ok()) return handler.status();
  ctx_.backend->BeginLaunch(request_id, decoded.key, handler->token);
  absl::Status status = ctx_.backend->Execute(handler->handler, decoded.frame);
  ctx_.backend->EndLaunch(status.ok());
  return status;
}

Platform RegisterFakePlatform() {
  static const Platform fake = [] {
    // The three rows of a platform; the index is the same in each table.
    const int index = AddPlatformForTest({"fake", "FAKE", "phony"});
    const Platform p = static_cast<Platform>(index);
    if (index < 0 ||
        !AddPlatformTraitsForTest({p, PlatformMemory::kHost,
                                   PlatformCompiler::kCxx,
                                   /*ffi_stream=*/false,
                                   /*ffi_thread_pool=*/false}) ||
        !AddExecutorRowForTest({p, &MakeExecutor<FakeExecutor>})) {
      std::abort();
    }
    return p;
  }();
  return fake;
}

}  // namespace kreg::testing
