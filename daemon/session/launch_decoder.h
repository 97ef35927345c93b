// Edge validation of a session Launch: turns an untrusted kreg.v1.Launch into
// a LaunchFrame whose buffers point into the session's arena.
#ifndef KREGD_DAEMON_SESSION_LAUNCH_DECODER_H_
#define KREGD_DAEMON_SESSION_LAUNCH_DECODER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/launch.h"
#include "daemon/session/shm_arena.h"
#include "daemon/types.h"
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

// Validates every field of `launch` (target name syntax, platform, dtype
// codes with a byte width, rank, dims >= 0, element count * width == size
// without overflow, offset + size inside `arena` without overflow; attribute
// kinds, dtypes, byte sizes, names sorted and unique, nesting and count
// bounds) and decodes it. INVALID_ARGUMENT / OUT_OF_RANGE / UNIMPLEMENTED
// with a message that names the field and quotes the bad value. The frame's
// pointers stay valid while `arena` is not replaced.
absl::StatusOr<DecodedLaunch> DecodeLaunch(const v1::Launch& launch,
                                           const ShmArena& arena);

// Validates and decodes one buffer descriptor; `what` names it in errors
// ("arg 2", "ret 0").
absl::StatusOr<BufferRef> DecodeBuffer(const v1::Buffer& buffer,
                                       const ShmArena& arena,
                                       const std::string& what);

// Validates and decodes a list of attributes.
absl::StatusOr<AttrList> DecodeAttrs(
    const google::protobuf::RepeatedPtrField<v1::Attribute>& attrs);

}  // namespace kreg

#endif  // KREGD_DAEMON_SESSION_LAUNCH_DECODER_H_
