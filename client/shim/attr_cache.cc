#include "client/shim/attr_cache.h"

#include <string.h>

#include <limits>
#include <utility>

#include "client/shim/launch_encoder.h"
#include "common/dtype.h"
#include "common/status_macros.h"

namespace kreg {
namespace shim {
namespace {

// As EncodeAttrs: deeper dictionaries are refused (and so never cached).
constexpr int kMaxDepth = 8;

// Snapshot sinks for Walk: one appends what it is given, the other compares
// it with a snapshot front to back.
struct Append {
  std::string* out;
  bool Put(const void* data, size_t n) {
    out->append(static_cast<const char*>(data), n);
    return true;
  }
};

struct Compare {
  const char* at;
  const char* end;
  bool Put(const void* data, size_t n) {
    if (static_cast<size_t>(end - at) < n) return false;
    if (n > 0 && memcmp(at, data, n) != 0) return false;
    at += n;
    return true;
  }
};

// Feeds everything the encoding of `attrs` depends on to `sink`: the count,
// then per attribute its type, name, and value (dtype, element count and
// bytes; a dictionary recursively). False when the sink refuses (a
// mismatch) or the attributes are not encodable as they are (unknown type
// or dtype, too deep): EncodeAttrs then reports why.
template <typename Sink>
bool Walk(const XLA_FFI_Attrs* attrs, int depth, Sink* sink) {
  if (depth > kMaxDepth) return false;
  const int64_t n = attrs->size;
  if (!sink->Put(&n, sizeof(n))) return false;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t type = attrs->types[i];
    const XLA_FFI_ByteSpan* name = attrs->names[i];
    const uint64_t name_len = name->len;
    if (!sink->Put(&type, sizeof(type)) ||
        !sink->Put(&name_len, sizeof(name_len)) ||
        !sink->Put(name->ptr, name->len)) {
      return false;
    }
    const void* value = attrs->attrs[i];
    switch (type) {
      case XLA_FFI_AttrType_SCALAR: {
        auto* s = static_cast<const XLA_FFI_Scalar*>(value);
        const int32_t dtype = s->dtype;
        const int width = DtypeByteWidth(dtype);
        if (width <= 0 || !sink->Put(&dtype, sizeof(dtype)) ||
            !sink->Put(s->value, static_cast<size_t>(width))) {
          return false;
        }
        break;
      }
      case XLA_FFI_AttrType_ARRAY: {
        auto* a = static_cast<const XLA_FFI_Array*>(value);
        const int32_t dtype = a->dtype;
        const int width = DtypeByteWidth(dtype);
        const uint64_t count = a->size;
        if (width <= 0 || count > std::numeric_limits<size_t>::max() / width ||
            !sink->Put(&dtype, sizeof(dtype)) ||
            !sink->Put(&count, sizeof(count)) ||
            !sink->Put(a->data, count * width)) {
          return false;
        }
        break;
      }
      case XLA_FFI_AttrType_STRING: {
        auto* s = static_cast<const XLA_FFI_ByteSpan*>(value);
        const uint64_t len = s->len;
        if (!sink->Put(&len, sizeof(len)) || !sink->Put(s->ptr, s->len)) {
          return false;
        }
        break;
      }
      case XLA_FFI_AttrType_DICTIONARY:
        if (!Walk(static_cast<const XLA_FFI_Attrs*>(value), depth + 1, sink)) {
          return false;
        }
        break;
      default:
        return false;
    }
  }
  return true;
}

}  // namespace

ClientStatus AttrCache::Get(const XLA_FFI_Attrs* attrs,
                            const std::string** bytes) {
  static const std::string* const kNone = new std::string();
  if (attrs->size == 0) {
    *bytes = kNone;
    return ClientStatus::Ok();
  }
  const void* key = attrs->attrs;
  ++clock_;
  for (Entry& e : entries_) {
    if (e.key != key) continue;
    Compare same{e.snapshot.data(), e.snapshot.data() + e.snapshot.size()};
    if (Walk(attrs, 0, &same) && same.at == same.end) {
      e.used = clock_;
      ++hits_;
      *bytes = &e.bytes;
      return ClientStatus::Ok();
    }
    e.key = nullptr;  // that table now holds other attributes
    break;
  }
  // The same attributes under another table (another program)?
  scratch_.clear();
  Append snapshot{&scratch_};
  const bool cacheable =
      Walk(attrs, 0, &snapshot) && scratch_.size() <= kMaxEntryBytes;
  if (cacheable) {
    for (Entry& e : entries_) {
      if (e.snapshot != scratch_) continue;
      for (Entry& other : entries_) {
        if (other.key == key) other.key = nullptr;
      }
      e.key = key;
      e.used = clock_;
      ++hits_;
      *bytes = &e.bytes;
      return ClientStatus::Ok();
    }
  }
  ++misses_;
  block_.Clear();
  KREG_RETURN_IF_ERROR(EncodeAttrs(attrs, block_.mutable_attrs()));
  block_.SerializeToString(&uncached_);
  if (!cacheable || uncached_.size() > kMaxEntryBytes) {
    *bytes = &uncached_;
    return ClientStatus::Ok();
  }
  *bytes = Remember(key, std::move(scratch_), uncached_);
  return ClientStatus::Ok();
}

const std::string* AttrCache::Remember(const void* key, std::string snapshot,
                                       const std::string& bytes) {
  for (Entry& other : entries_) {
    if (other.key == key) other.key = nullptr;
  }
  Entry* e;
  if (entries_.size() < kMaxEntries) {
    e = &entries_.emplace_back();
  } else {
    e = &entries_[0];
    for (Entry& other : entries_) {
      if (other.used < e->used) e = &other;
    }
  }
  e->key = key;
  e->snapshot = std::move(snapshot);
  e->bytes = bytes;
  e->used = clock_;
  return &e->bytes;
}

}  // namespace shim
}  // namespace kreg
