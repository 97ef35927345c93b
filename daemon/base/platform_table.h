// What kregd and its executors do differently per platform (DESIGN §2, §3,
// §8): one row per row of common/platforms.h (which spells the platforms),
// at the same index. This half is data and pure checks: kregd links it
// (registry rules, status) as do the executors (decoders, XLA FFI API).
// What runs a platform's launches is the executor-only half,
// daemon/executor/platform_executors.h. A new platform is a row in each
// (docs/adding-a-platform.md).
#ifndef KREGD_DAEMON_BASE_PLATFORM_TABLE_H_
#define KREGD_DAEMON_BASE_PLATFORM_TABLE_H_

#include <vector>

#include "daemon/base/types.h"

namespace kreg {

// Where a platform's buffers live.
enum class PlatformMemory {
  // Host memory: a buffer is an offset into the session's arena, a launch
  // ring descriptor carries no device fields, and XLA_FFI_DeviceMemory_*
  // hand out host memory.
  kHost,
  // CUDA device memory: a buffer is part of a CUDA allocation the client
  // shared (resolved through the executor's CudaBufferResolver), a ring
  // descriptor carries a device UUID and a doorbell sequence number,
  // scratch memory comes from the call's device allocator, a target is not
  // runnable while this kregd cannot run CUDA launches (runnable.h), and an
  // executor whose launch left a sticky CUDA error is recycled
  // (daemon/executor/executor_backend.cc).
  kCuda,
};

// What the compile service (daemon/compile_service/) builds a platform's
// sources with.
enum class PlatformCompiler {
  kCxx,   // the C++ compiler (compile_cxx): C and C++ sources
  kNvcc,  // nvcc (compile_nvcc): .cu sources as well
};

struct PlatformTraits {
  Platform platform;  // the row's index in common/platforms.h
  PlatformMemory memory;
  PlatformCompiler compiler;
  // The XLA FFI API's platform pieces (daemon/executor/ffi/ffi_api.cc): whether
  // XLA_FFI_Stream_Get answers with the call's stream (else UNIMPLEMENTED,
  // as XLA:CPU), and whether XLA_FFI_ThreadPool_* have a pool (else
  // UNIMPLEMENTED, as XLA:GPU).
  bool ffi_stream;
  bool ffi_thread_pool;
};

// The row of `platform` (a Platform comes from ParsePlatform or a row
// index, so there is one).
const PlatformTraits& TraitsOf(Platform platform);

// Every platform, in table order (for what names each: status, metrics,
// lookups of a name on every platform).
std::vector<Platform> AllPlatforms();

// Tests only (a fake platform, docs/adding-a-platform.md): adds the row of
// a platform common/platforms.h's AddPlatformForTest added; false unless
// traits.platform is the next index. Not thread-safe: call before any
// other thread reads the table.
bool AddPlatformTraitsForTest(const PlatformTraits& traits);

}  // namespace kreg

#endif  // KREGD_DAEMON_BASE_PLATFORM_TABLE_H_
