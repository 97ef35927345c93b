// The shim's per-call-site attribute cache (client/shim/attr_cache.h): the
// bytes it hands out are always what EncodeAttrs would encode for the call's
// attributes now, whatever XLA did to the tables since they were cached
// (values rewritten in place, names, dtypes, counts or nesting changed, a
// table freed and its address reused); same attributes under another table
// are found without encoding; bounded; errors are never cached.
#include "client/shim/attr_cache.h"

#include <cstring>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "client/shim/launch_encoder.h"
#include "xla/ffi/api/c_api.h"

namespace kreg::shim {
namespace {

// XLA_FFI_Attrs laid out as XLA lays them out; the tables live here, so a
// test can rewrite them in place.
struct Attrs {
  void Add(const char* name, XLA_FFI_AttrType type, void* value) {
    names_text.push_back(name);
    types.push_back(type);
    values.push_back(value);
  }
  XLA_FFI_Attrs* Build() {
    spans.clear();
    names.clear();
    for (const std::string& n : names_text) {
      spans.push_back({n.data(), n.size()});
    }
    for (auto& s : spans) names.push_back(&s);
    attrs = XLA_FFI_Attrs{XLA_FFI_Attrs_STRUCT_SIZE,
                          nullptr,
                          static_cast<int64_t>(types.size()),
                          types.data(),
                          names.data(),
                          values.data()};
    return &attrs;
  }
  std::vector<std::string> names_text;
  std::vector<XLA_FFI_ByteSpan> spans;
  std::vector<XLA_FFI_ByteSpan*> names;
  std::vector<XLA_FFI_AttrType> types;
  std::vector<void*> values;
  XLA_FFI_Attrs attrs;
};

// What the cache must hand out: EncodeAttrs into an AttributeBlock.
std::string Expected(const XLA_FFI_Attrs* attrs) {
  v1::AttributeBlock block;
  REQUIRE(EncodeAttrs(attrs, block.mutable_attrs()).ok());
  return block.SerializeAsString();
}

std::string Get(AttrCache* cache, const XLA_FFI_Attrs* attrs) {
  const std::string* bytes = nullptr;
  ClientStatus s = cache->Get(attrs, &bytes);
  REQUIRE(s.ok());
  REQUIRE(bytes != nullptr);
  return *bytes;
}

TEST_CASE("AttrCache: one encoding per call site, reused while unchanged",
          "[shim][attr_cache]") {
  float factor = 2.0f;
  XLA_FFI_Scalar s{XLA_FFI_DataType_F32, &factor};
  Attrs a;
  a.Add("factor", XLA_FFI_AttrType_SCALAR, &s);
  XLA_FFI_Attrs* attrs = a.Build();
  AttrCache cache;
  const std::string want = Expected(attrs);
  for (int i = 0; i < 5; ++i) CHECK(Get(&cache, attrs) == want);
  CHECK(cache.misses() == 1);
  CHECK(cache.hits() == 4);
  CHECK(cache.size() == 1);
}

TEST_CASE("AttrCache: values rewritten in place are encoded again",
          "[shim][attr_cache]") {
  float factor = 2.0f;
  XLA_FFI_Scalar s{XLA_FFI_DataType_F32, &factor};
  int32_t ints[3] = {1, 2, 3};
  XLA_FFI_Array arr{XLA_FFI_DataType_S32, 3, ints};
  std::string text = "abc";
  XLA_FFI_ByteSpan str{text.data(), text.size()};
  Attrs a;
  a.Add("a", XLA_FFI_AttrType_ARRAY, &arr);
  a.Add("factor", XLA_FFI_AttrType_SCALAR, &s);
  a.Add("s", XLA_FFI_AttrType_STRING, &str);
  XLA_FFI_Attrs* attrs = a.Build();
  AttrCache cache;
  CHECK(Get(&cache, attrs) == Expected(attrs));

  // Every change below keeps XLA's table at the same address: only the
  // comparison with what was encoded can tell.
  factor = 3.0f;
  CHECK(Get(&cache, attrs) == Expected(attrs));
  ints[2] = 7;
  CHECK(Get(&cache, attrs) == Expected(attrs));
  arr.size = 2;  // fewer elements
  CHECK(Get(&cache, attrs) == Expected(attrs));
  text = "abd";
  str.ptr = text.data();
  CHECK(Get(&cache, attrs) == Expected(attrs));
  str.len = 2;
  CHECK(Get(&cache, attrs) == Expected(attrs));
  s.dtype = XLA_FFI_DataType_S32;  // same bytes, another dtype
  CHECK(Get(&cache, attrs) == Expected(attrs));
  a.names_text[1] = "factos";  // same length, another name
  a.Build();
  CHECK(Get(&cache, attrs) == Expected(attrs));
  a.types[2] = XLA_FFI_AttrType_ARRAY;  // another kind under the same name
  a.values[2] = &arr;
  CHECK(Get(&cache, attrs) == Expected(attrs));
  a.attrs.size = 1;  // fewer attributes, same table
  CHECK(Get(&cache, attrs) == Expected(attrs));
  CHECK(cache.hits() == 0);
  CHECK(cache.misses() == 10);
  // The same table again, unchanged: reused.
  CHECK(Get(&cache, attrs) == Expected(attrs));
  CHECK(cache.hits() == 1);
}

TEST_CASE("AttrCache: a nested dictionary changed in place is encoded again",
          "[shim][attr_cache]") {
  double d = 1.5;
  XLA_FFI_Scalar inner_value{XLA_FFI_DataType_F64, &d};
  Attrs inner;
  inner.Add("x", XLA_FFI_AttrType_SCALAR, &inner_value);
  Attrs outer;
  outer.Add("dict", XLA_FFI_AttrType_DICTIONARY, inner.Build());
  XLA_FFI_Attrs* attrs = outer.Build();
  AttrCache cache;
  CHECK(Get(&cache, attrs) == Expected(attrs));
  d = -4.0;
  CHECK(Get(&cache, attrs) == Expected(attrs));
  inner.names_text[0] = "y";
  inner.Build();
  CHECK(Get(&cache, attrs) == Expected(attrs));
  CHECK(cache.misses() == 3);
}

TEST_CASE("AttrCache: a freed table whose address is reused for others",
          "[shim][attr_cache]") {
  // One buffer of values stands for XLA's memory, handed to one program's
  // attributes, freed, then to another program's with other values.
  std::vector<void*> values(1);
  XLA_FFI_AttrType type = XLA_FFI_AttrType_SCALAR;
  XLA_FFI_ByteSpan name{"n", 1};
  XLA_FFI_ByteSpan* names[1] = {&name};
  int64_t first = 10, second = 20;
  XLA_FFI_Scalar s1{XLA_FFI_DataType_S64, &first};
  XLA_FFI_Scalar s2{XLA_FFI_DataType_S64, &second};
  XLA_FFI_Attrs attrs{
      XLA_FFI_Attrs_STRUCT_SIZE, nullptr, 1, &type, names, values.data()};
  AttrCache cache;
  values[0] = &s1;
  const std::string one = Get(&cache, &attrs);
  values[0] = &s2;
  const std::string two = Get(&cache, &attrs);
  CHECK(one != two);
  CHECK(two == Expected(&attrs));
  values[0] = &s1;  // the first program's values again: still cached
  CHECK(Get(&cache, &attrs) == one);
  CHECK(cache.misses() == 2);
  CHECK(cache.hits() == 1);
}

TEST_CASE("AttrCache: equal attributes under another table are reused",
          "[shim][attr_cache]") {
  int32_t v = 5;
  XLA_FFI_Scalar s{XLA_FFI_DataType_S32, &v};
  Attrs a, b;
  a.Add("k", XLA_FFI_AttrType_SCALAR, &s);
  b.Add("k", XLA_FFI_AttrType_SCALAR, &s);
  AttrCache cache;
  const std::string want = Expected(a.Build());
  CHECK(Get(&cache, a.Build()) == want);
  CHECK(Get(&cache, b.Build()) == want);
  CHECK(cache.misses() == 1);
  CHECK(cache.hits() == 1);
  CHECK(cache.size() == 1);
}

TEST_CASE("AttrCache: bounded; the least recently used site is evicted",
          "[shim][attr_cache]") {
  const size_t n = AttrCache::kMaxEntries + 8;
  std::vector<int64_t> values(n);
  std::vector<XLA_FFI_Scalar> scalars(n);
  std::vector<Attrs> sites(n);
  AttrCache cache;
  for (size_t i = 0; i < n; ++i) {
    values[i] = static_cast<int64_t>(i);
    scalars[i] = XLA_FFI_Scalar{XLA_FFI_DataType_S64, &values[i]};
    sites[i].Add("i", XLA_FFI_AttrType_SCALAR, &scalars[i]);
    XLA_FFI_Attrs* attrs = sites[i].Build();
    CHECK(Get(&cache, attrs) == Expected(attrs));
  }
  CHECK(cache.size() == AttrCache::kMaxEntries);
  // The most recent sites are still there; the first ones were evicted.
  const uint64_t misses = cache.misses();
  CHECK(Get(&cache, &sites[n - 1].attrs) == Expected(&sites[n - 1].attrs));
  CHECK(cache.misses() == misses);
  CHECK(Get(&cache, &sites[0].attrs) == Expected(&sites[0].attrs));
  CHECK(cache.misses() == misses + 1);
}

TEST_CASE("AttrCache: no attributes, large ones, and refused ones",
          "[shim][attr_cache]") {
  AttrCache cache;
  Attrs none;
  CHECK(Get(&cache, none.Build()).empty());
  CHECK(cache.size() == 0);

  // Larger than an entry may be: encoded every call, correctly.
  std::vector<uint8_t> big(AttrCache::kMaxEntryBytes + 1, 7);
  XLA_FFI_Array arr{XLA_FFI_DataType_U8, big.size(), big.data()};
  Attrs large;
  large.Add("big", XLA_FFI_AttrType_ARRAY, &arr);
  XLA_FFI_Attrs* attrs = large.Build();
  CHECK(Get(&cache, attrs) == Expected(attrs));
  big[3] = 9;
  CHECK(Get(&cache, attrs) == Expected(attrs));
  CHECK(cache.size() == 0);

  // A dtype without a byte width: EncodeAttrs' error, every time.
  uint8_t nibble = 1;
  XLA_FFI_Scalar s4{XLA_FFI_DataType_S4, &nibble};
  Attrs bad;
  bad.Add("nibble", XLA_FFI_AttrType_SCALAR, &s4);
  for (int i = 0; i < 2; ++i) {
    const std::string* bytes = nullptr;
    ClientStatus s = cache.Get(bad.Build(), &bytes);
    CHECK(s.code == kInvalidArgument);
    CHECK(s.message ==
          "kreg cannot forward scalar attribute \"nibble\" of dtype code 21");
  }
  CHECK(cache.size() == 0);
  // Fixed in place: now encodable.
  s4.dtype = XLA_FFI_DataType_U8;
  CHECK(Get(&cache, &bad.attrs) == Expected(&bad.attrs));
}

}  // namespace
}  // namespace kreg::shim
