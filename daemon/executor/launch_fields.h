// Edge validation of a launch descriptor's fields (RingDecoder's parts):
// one buffer against the session's arena or a CUDA allocation, and the
// attribute list, with the bounds on what one launch may carry.
#ifndef KREGD_DAEMON_EXECUTOR_LAUNCH_FIELDS_H_
#define KREGD_DAEMON_EXECUTOR_LAUNCH_FIELDS_H_

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
  uint32_t generation = 0;  // pinned (docs/replace.md §7); 0: the current
  uint64_t state = 0;       // the call site's state handle; 0: none
  LaunchFrame frame;
};

// A client GPU allocation a CUDA buffer names (a descriptor's CudaRef with
// the header's device).
struct CudaRefView {
  absl::string_view device_uuid;  // 16 raw bytes
  uint64_t base = 0;
  uint64_t size = 0;
  uint64_t generation = 0;
};

// Resolves a CUDA buffer (`ref`, then [offset, offset + size) inside it) to
// kregd's device address; `what` names the buffer in errors.
using CudaBufferResolver = std::function<absl::StatusOr<void*>(
    const CudaRefView& ref, uint64_t offset, uint64_t size,
    const std::string& what)>;

// The alignment of every non-empty buffer in a session's arena.
inline constexpr uint64_t kArenaBufferAlign = 64;

// Validates and decodes one buffer of a descriptor: dtype (a code with a
// byte width), `rank` (at most kMaxLaunchRank) dims at `dims` (>= 0),
// element count * width == size without overflow, [offset, offset + size)
// inside `arena` without overflow, a non-empty buffer's `offset` a multiple
// of kArenaBufferAlign; fills `out` (its dims vector is reused).
// `what` names it in errors ("arg 2", "ret 0"): INVALID_ARGUMENT /
// OUT_OF_RANGE quoting the bad value.
absl::Status DecodeArenaBuffer(int32_t dtype, const int64_t* dims, size_t rank,
                               uint64_t offset, uint64_t size,
                               const ShmArena& arena, const std::string& what,
                               BufferRef* out);
// The same shape checks for a CUDA launch's buffer, resolved through
// `cuda`: a buffer of size 0 gets null; `ref` null (a buffer that names no
// allocation) is INVALID_ARGUMENT for any other size.
absl::Status DecodeCudaBufferFields(int32_t dtype, const int64_t* dims,
                                    size_t rank, const CudaRefView* ref,
                                    uint64_t offset, uint64_t size,
                                    const CudaBufferResolver& cuda,
                                    const std::string& what, BufferRef* out);

// The same shape checks for a buffer that carries its shape only (a
// StageCall's, session.proto): `out` gets a null data pointer.
absl::Status DecodeBufferShape(int32_t dtype, const int64_t* dims, size_t rank,
                               uint64_t size, const std::string& what,
                               BufferRef* out);

// Validates and decodes a list of attributes: kinds, dtypes, byte sizes,
// names (1-kMaxAttrNameBytes bytes) sorted and unique, nesting
// (kMaxAttrDepth) and count (kMaxLaunchAttrs) bounds.
absl::StatusOr<AttrList> DecodeAttrs(
    const google::protobuf::RepeatedPtrField<v1::Attribute>& attrs);

}  // namespace kreg

#endif  // KREGD_DAEMON_EXECUTOR_LAUNCH_FIELDS_H_
