// Edge validation of a session Launch: turns an untrusted kreg.v1.Launch into
// a LaunchFrame whose buffers point into the session's arena.
#ifndef KREGD_DAEMON_EXECUTOR_LAUNCH_DECODER_H_
#define KREGD_DAEMON_EXECUTOR_LAUNCH_DECODER_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/base/launch.h"
#include "daemon/base/types.h"
#include "daemon/executor/shm_arena.h"
#include "kreg/v1/session.pb.h"

namespace kreg {

// Bounds on what one launch may carry.
constexpr int kMaxLaunchRank = 64;
constexpr int kMaxLaunchBuffers = 4096;  // args and rets, each
constexpr int kMaxLaunchAttrs = 4096;    // all attributes, nested included
constexpr int kMaxAttrDepth = 8;         // dictionary nesting
constexpr size_t kMaxAttrNameBytes = 256;

struct DecodedLaunch {
  TargetKey key;
  LaunchFrame frame;
};

// A client GPU allocation a CUDA buffer names (a kreg.v1.CudaMappingRef, or
// a launch-ring descriptor's CudaRef with the header's device).
struct CudaRefView {
  absl::string_view device_uuid;  // 16 raw bytes when well formed
  uint64_t base = 0;
  uint64_t size = 0;
  uint64_t generation = 0;
};
CudaRefView RefView(const v1::CudaMappingRef& ref);

// Resolves a CUDA buffer (`ref`, then [offset, offset + size) inside it) to
// kregd's device address; `what` names the buffer in errors.
using CudaBufferResolver = std::function<absl::StatusOr<void*>(
    const CudaRefView& ref, uint64_t offset, uint64_t size,
    const std::string& what)>;

// Validates every field of `launch` (target name syntax, platform, dtype
// codes with a byte width, rank, dims >= 0, element count * width == size
// without overflow, offset + size inside `arena` without overflow; attribute
// kinds, dtypes, byte sizes, names sorted and unique, nesting and count
// bounds) and decodes it. INVALID_ARGUMENT / OUT_OF_RANGE / UNIMPLEMENTED
// with a message that names the field and quotes the bad value. The frame's
// pointers stay valid while `arena` is not replaced.
//
// CUDA launches (platform cuda) need `cuda`: every buffer of non-zero size
// must name its allocation (Buffer.cuda) and is resolved through `cuda`; a
// zero-size buffer gets null. Without `cuda` a CUDA launch is UNIMPLEMENTED
// ("kregd has no CUDA device"); a CPU launch whose buffers name CUDA
// allocations is INVALID_ARGUMENT.
absl::StatusOr<DecodedLaunch> DecodeLaunch(
    const v1::Launch& launch, const ShmArena& arena,
    const CudaBufferResolver* cuda = nullptr);

// Validates and decodes one buffer descriptor; `what` names it in errors
// ("arg 2", "ret 0").
absl::StatusOr<BufferRef> DecodeBuffer(const v1::Buffer& buffer,
                                       const ShmArena& arena,
                                       const std::string& what);
// The same from plain fields (the launch ring's descriptors): dtype, `rank`
// dims at `dims`, [offset, offset + size) in `arena`; fills `out` (its dims
// vector is reused). Exactly DecodeBuffer's checks and messages.
absl::Status DecodeArenaBuffer(int32_t dtype, const int64_t* dims, size_t rank,
                               uint64_t offset, uint64_t size,
                               const ShmArena& arena, const std::string& what,
                               BufferRef* out);
// The same for a CUDA launch's buffer.
absl::StatusOr<BufferRef> DecodeCudaBuffer(const v1::Buffer& buffer,
                                           const CudaBufferResolver& cuda,
                                           const std::string& what);
// The same from plain fields (a launch-ring CUDA descriptor): `ref` null for
// a buffer that names no allocation. Exactly DecodeCudaBuffer's checks and
// messages; fills `out` (its dims vector is reused).
absl::Status DecodeCudaBufferFields(int32_t dtype, const int64_t* dims,
                                    size_t rank, const CudaRefView* ref,
                                    uint64_t offset, uint64_t size,
                                    const CudaBufferResolver& cuda,
                                    const std::string& what, BufferRef* out);

// Validates and decodes a list of attributes.
absl::StatusOr<AttrList> DecodeAttrs(
    const google::protobuf::RepeatedPtrField<v1::Attribute>& attrs);

}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_LAUNCH_DECODER_H_
