// Builders for LaunchFrames over local vectors, for FfiHost tests.
#ifndef KREGD_TESTS_DAEMON_EXECUTOR_FFI_LAUNCH_BUILDERS_H_
#define KREGD_TESTS_DAEMON_EXECUTOR_FFI_LAUNCH_BUILDERS_H_

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "daemon/base/launch.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace testing {

// A rank-1 buffer over `values` (borrowed).
template <typename T>
BufferRef Buffer(XLA_FFI_DataType dtype, std::vector<T>& values) {
  BufferRef ref;
  ref.dtype = dtype;
  ref.dims = {static_cast<int64_t>(values.size())};
  ref.data = values.data();
  return ref;
}

template <typename T>
Attr Scalar(XLA_FFI_DataType dtype, T value) {
  Attr attr;
  attr.kind = Attr::Kind::kScalar;
  attr.dtype = dtype;
  attr.bytes.assign(reinterpret_cast<const char*>(&value), sizeof(T));
  return attr;
}

template <typename T>
Attr Array(XLA_FFI_DataType dtype, const std::vector<T>& values) {
  Attr attr;
  attr.kind = Attr::Kind::kArray;
  attr.dtype = dtype;
  attr.count = static_cast<int64_t>(values.size());
  attr.bytes.resize(values.size() * sizeof(T));
  if (!values.empty()) {
    std::memcpy(&attr.bytes[0], values.data(), attr.bytes.size());
  }
  return attr;
}

inline Attr String(std::string value) {
  Attr attr;
  attr.kind = Attr::Kind::kString;
  attr.bytes = std::move(value);
  return attr;
}

inline Attr Dict(AttrList entries) {
  Attr attr;
  attr.kind = Attr::Kind::kDict;
  attr.dict = std::move(entries);
  return attr;
}

inline void* AsHandler(XLA_FFI_Handler* handler) {
  return reinterpret_cast<void*>(handler);
}

}  // namespace testing
}  // namespace kreg

#endif  // KREGD_TESTS_DAEMON_EXECUTOR_FFI_LAUNCH_BUILDERS_H_
