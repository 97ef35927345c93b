// Fuzzes DecodeLaunch: the input is a serialized kreg.v1.Launch, decoded
// against a real 64 KiB memfd arena (and, for CUDA launches, a fake resolver
// that bounds-checks like the real mapping cache). Every decoded CPU buffer
// must lie inside the arena; it is written or read in full.
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "daemon/executor/launch_decoder.h"
#include "tests/fuzz/buffer_check.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

constexpr uint64_t kArenaBytes = 64 << 10;

kreg::ShmArena* Arena() {
  static kreg::ShmArena* arena = [] {
    auto* a = new kreg::ShmArena(1 << 20);
    if (!a->Replace(kreg::fuzz::SealedMemfd(kArenaBytes), kArenaBytes).ok()) {
      kreg::fuzz::Fail("arena");
    }
    return a;
  }();
  return arena;
}

// A fake device allocation of 4 KiB per mapping; a region outside it is
// OUT_OF_RANGE, as in CudaMappingCache.
absl::StatusOr<void*> ResolveCuda(const kreg::CudaRefView& ref, uint64_t offset,
                                  uint64_t size, const std::string& what) {
  static char device[4096];
  uint64_t end;
  if (__builtin_add_overflow(offset, size, &end) || end > sizeof(device) ||
      ref.device_uuid.size() != 16) {
    return absl::OutOfRangeError(absl::StrCat(what, " is out of range"));
  }
  return device + offset;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kreg::fuzz::QuietLogs();
  Arena();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kreg::v1::Launch launch;
  if (!launch.ParseFromArray(data, static_cast<int>(size))) return 0;
  const kreg::CudaBufferResolver cuda = ResolveCuda;
  kreg::ShmArena* arena = Arena();
  for (const kreg::CudaBufferResolver* resolver :
       {&cuda, static_cast<const kreg::CudaBufferResolver*>(nullptr)}) {
    absl::StatusOr<kreg::DecodedLaunch> d =
        kreg::DecodeLaunch(launch, *arena, resolver);
    if (!d.ok()) {
      if (d.status().message().empty()) kreg::fuzz::Fail("error without text");
      continue;
    }
    if (d->frame.platform == kreg::Platform::kCpu) {
      absl::StatusOr<char*> base = arena->Region(0, 0);
      kreg::fuzz::CheckCpuFrame(d->frame, *base, arena->size());
    } else {
      for (const auto* list : {&d->frame.args, &d->frame.rets}) {
        for (const kreg::BufferRef& b : *list) kreg::fuzz::BufferBytes(b);
      }
    }
  }
  return 0;
}
