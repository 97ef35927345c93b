#include "daemon/registry/runnable.h"

#include "catch2/catch.hpp"

namespace kreg {
namespace {

TargetEntry Entry(Platform platform) {
  TargetEntry e;
  e.key = {"demo.scale", platform};
  return e;
}

TEST_CASE("A cuda target is not runnable on a kregd without GPUs",
          "[runnable]") {
  std::string why = NotRunnableReason(Entry(Platform::kCuda),
                                      absl::UnavailableError("no CUDA driver"));
  CHECK(why.find("cannot run CUDA") != std::string::npos);
  CHECK(why.find("no CUDA driver") != std::string::npos);
}

TEST_CASE("cpu targets and cuda targets with GPUs are runnable", "[runnable]") {
  CHECK(
      NotRunnableReason(Entry(Platform::kCpu), absl::UnavailableError("no GPU"))
          .empty());
  CHECK(NotRunnableReason(Entry(Platform::kCuda), absl::OkStatus()).empty());
}

TEST_CASE("In-process targets are runnable whatever kregd serves",
          "[runnable]") {
  TargetEntry e = Entry(Platform::kCuda);
  e.kind = TargetKind::kInProcess;
  CHECK(NotRunnableReason(e, absl::UnavailableError("no GPU")).empty());
}

TEST_CASE("A target whose module could not be loaded says why", "[runnable]") {
  TargetEntry e = Entry(Platform::kCpu);
  e.unavailable = "digest mismatch";
  CHECK(NotRunnableReason(e, absl::OkStatus()).find("digest mismatch") !=
        std::string::npos);
}

}  // namespace
}  // namespace kreg
