// A transport-independent description of one handler call, decoded and
// validated by the session layer and turned into an XLA_FFI_CallFrame by
// FfiHost. Pointers refer to memory the session keeps mapped for the call.
#ifndef KREGD_DAEMON_BASE_LAUNCH_H_
#define KREGD_DAEMON_BASE_LAUNCH_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "daemon/base/types.h"

namespace kreg {

struct BufferRef {
  int32_t dtype = 0;  // XLA_FFI_DataType value
  std::vector<int64_t> dims;
  void* data = nullptr;  // validated: dims * byte width fit the mapping
};

struct Attr;
// Attributes sorted by name (XLA's order; handlers binary-search them).
using AttrList = std::vector<std::pair<std::string, Attr>>;

struct Attr {
  enum class Kind { kScalar, kArray, kString, kDict };
  Kind kind = Kind::kScalar;
  int32_t dtype = 0;  // kScalar, kArray: XLA_FFI_DataType value
  std::string bytes;  // kScalar: the value; kArray: packed elements;
                      // kString: the characters
  int64_t count = 0;  // kArray: number of elements
  AttrList dict;      // kDict
};

struct LaunchFrame {
  Platform platform = Platform::kCpu;
  std::vector<BufferRef> args;
  std::vector<BufferRef> rets;
  AttrList attrs;
  // Nonzero: a promise that every LaunchFrame carrying this value carries
  // these very attributes (the same objects at the same addresses,
  // unmodified), so what a cache built from them (FfiHost's CallFrameCache)
  // stays valid. Whoever decodes new attributes gives them a value never
  // used before (RingDecoder); 0 promises nothing (built every call).
  uint64_t attrs_generation = 0;
  int32_t device_ordinal = 0;
  int64_t run_id = 0;
};

}  // namespace kreg

#endif  // KREGD_DAEMON_BASE_LAUNCH_H_
