// Fuzzes what kregd does with a BrokerRequest from an executor (broker.cc):
// the parse, then what SessionBroker::Handle runs before it needs a live
// executor: Resolve's name/platform validation and ResolveGeneration (the
// current entry or a pinned generation's) in a real Registry (in-memory
// loader and log). Registrations, which kregd takes on
// control connections, are fuzzed by control_frames.
#include <cstdint>

#include "daemon/base/validate.h"
#include "daemon/registry/registry.h"
#include "daemon/supervisor/broker.h"
#include "tests/daemon/registry/registry_fakes.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kreg::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kreg;
  static FakeLoader* loader = new FakeLoader;
  static MemLog* log = new MemLog;
  static Registry* registry = new Registry(loader, log);
  v1::BrokerRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return 0;
  if (req.body_case() != v1::BrokerRequest::kResolve) return 0;
  const v1::ResolveRequest& r = req.resolve();
  if (!ValidateTargetName(r.target_name()).ok()) return 0;
  absl::StatusOr<Platform> platform = ParsePlatform(r.platform());
  if (!platform.ok()) return 0;
  absl::StatusOr<EntryPtr> e = ResolveGeneration(
      *registry, TargetKey{r.target_name(), *platform}, r.generation());
  if (e.ok() && (*e)->key.name != r.target_name()) {
    fuzz::Fail("lookup returned another target");
  }
  return 0;
}
