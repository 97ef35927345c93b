// The attribute bytes of the call sites one thread forwards, encoded once per
// call site and reused while unchanged (DESIGN §9): the forwarding hot path
// then builds no protobuf.
#ifndef KREGD_CLIENT_SHIM_ATTR_CACHE_H_
#define KREGD_CLIENT_SHIM_ATTR_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "kreg/v1/session.pb.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace shim {

// Maps XLA_FFI_Attrs to their descriptor bytes (EncodeAttrs into a
// kreg.v1.AttributeBlock, serialized). An
// entry is looked up by the address of XLA's attribute table, but used only
// after the call's attributes compare equal to the ones it was encoded from
// (count, names, types, dtypes, element counts and value bytes, dictionaries
// included): XLA may free a compiled program and reuse its memory for
// another, or change values in place. Bounded (kMaxEntries, evicting the
// least recently used; attributes whose bytes exceed kMaxEntryBytes are
// encoded every call). Thread-compatible: one per forwarding thread.
class AttrCache {
 public:
  static constexpr size_t kMaxEntries = 64;
  static constexpr size_t kMaxEntryBytes = 16 * 1024;

  AttrCache() = default;
  AttrCache(const AttrCache&) = delete;
  AttrCache& operator=(const AttrCache&) = delete;

  // Sets `*bytes` to the descriptor bytes of `attrs`: a cached entry's when
  // one matches, else encoded now (and remembered). EncodeAttrs' errors
  // (INVALID_ARGUMENT for attributes that cannot be forwarded), never
  // cached. `*bytes` stays valid until the next call.
  ClientStatus Get(const XLA_FFI_Attrs* attrs, const std::string** bytes);

  // Encodings done (misses) and reused (hits) so far.
  uint64_t misses() const { return misses_; }
  uint64_t hits() const { return hits_; }
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    const void* key = nullptr;  // XLA's attribute table (attrs->attrs)
    std::string snapshot;       // what the bytes were encoded from
    std::string bytes;
    uint64_t used = 0;
  };

  const std::string* Remember(const void* key, std::string snapshot,
                              const std::string& bytes);

  std::vector<Entry> entries_;
  std::string scratch_;       // the call's snapshot, on a key miss
  std::string uncached_;      // bytes too large to keep
  v1::AttributeBlock block_;  // encoding scratch
  uint64_t clock_ = 0;
  uint64_t misses_ = 0;
  uint64_t hits_ = 0;
};

}  // namespace shim
}  // namespace kreg

#endif  // KREGD_CLIENT_SHIM_ATTR_CACHE_H_
