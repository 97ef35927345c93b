// The field checks of a launch descriptor (launch_fields.h), through the
// one decoder (RingDecoder) of a descriptor as a socket Launch carries it.
#include "daemon/executor/launch_fields.h"

#include <cstring>
#include <string>

#include "catch2/catch.hpp"
#include "daemon/executor/ring_decoder.h"
#include "tests/daemon/executor/decode_fixture.h"
#include "xla/ffi/api/c_api.h"

namespace kreg {
namespace {

using ::kreg::testing::Arena;
using ::kreg::testing::BufferSpec;
using ::kreg::testing::EncodeSpec;
using ::kreg::testing::LaunchSpec;
using ::kreg::testing::SocketDecode;

BufferSpec Buf(int dtype, std::initializer_list<int64_t> dims, uint64_t offset,
               uint64_t size) {
  BufferSpec b;
  b.set_dtype(dtype);
  for (int64_t d : dims) b.add_dims(d);
  b.set_offset(offset);
  b.set_size(size);
  return b;
}

LaunchSpec ScaleLaunch() {
  LaunchSpec l;
  l.set_target_name("demo.scale");
  l.set_platform("cpu");
  *l.add_args() = Buf(XLA_FFI_DataType_F32, {4}, 0, 16);
  *l.add_rets() = Buf(XLA_FFI_DataType_F32, {4}, 64, 16);
  v1::Attribute* a = l.add_attrs();
  a->set_name("factor");
  a->set_kind(v1::ATTR_KIND_SCALAR);
  a->set_dtype(XLA_FFI_DataType_F32);
  float f = 2.0f;
  a->set_data(std::string(reinterpret_cast<char*>(&f), 4));
  return l;
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// One buffer's checks (DecodeArenaBuffer), `what` naming it.
absl::StatusOr<BufferRef> DecodeBuffer(const BufferSpec& b,
                                       const ShmArena& arena,
                                       const std::string& what) {
  BufferRef out;
  absl::Status s = DecodeArenaBuffer(b.dtype(), b.dims().data(), b.dims_size(),
                                     b.offset(), b.size(), arena, what, &out);
  if (!s.ok()) return s;
  return out;
}

TEST_CASE("A socket descriptor decodes a valid launch", "[decode]") {
  Arena fx;
  auto d = SocketDecode(ScaleLaunch(), fx.arena);
  REQUIRE(d.ok());
  CHECK(d->key.name == "demo.scale");
  CHECK(d->key.platform == Platform::kCpu);
  REQUIRE(d->frame.args.size() == 1);
  CHECK(d->frame.args[0].dims == std::vector<int64_t>{4});
  CHECK(d->frame.args[0].data == *fx.arena.Region(0, 16));
  CHECK(d->frame.rets[0].data == *fx.arena.Region(64, 16));
  REQUIRE(d->frame.attrs.size() == 1);
  CHECK(d->frame.attrs[0].first == "factor");
  CHECK(d->frame.attrs[0].second.kind == Attr::Kind::kScalar);
  CHECK(d->frame.attrs[0].second.bytes.size() == 4);
}

TEST_CASE("A socket descriptor accepts 0-d, zero-size and aliased buffers",
          "[decode]") {
  Arena fx;
  LaunchSpec l = ScaleLaunch();
  *l.add_args() = Buf(XLA_FFI_DataType_F64, {}, 128, 8);          // 0-d
  *l.add_args() = Buf(XLA_FFI_DataType_S32, {3, 0, 2}, 4096, 0);  // empty
  *l.add_rets() = Buf(XLA_FFI_DataType_F32, {4}, 0, 16);          // alias
  auto d = SocketDecode(l, fx.arena);
  REQUIRE(d.ok());
  CHECK(d->frame.args[1].dims.empty());
  CHECK(d->frame.rets[1].data == d->frame.args[0].data);
}

TEST_CASE("A socket descriptor: bad target name", "[decode]") {
  Arena fx;
  LaunchSpec l = ScaleLaunch();
  l.set_target_name("9bad name");
  auto d = SocketDecode(l, fx.arena);
  CHECK(d.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(Message(d.status()),
             Catch::Contains("\"9bad name\" must start with a letter"));
}

TEST_CASE("A socket descriptor: unknown platform", "[decode]") {
  Arena fx;
  LaunchSpec l = ScaleLaunch();
  l.set_platform("rocm");
  auto d = SocketDecode(l, fx.arena);
  CHECK(d.status().code() == absl::StatusCode::kUnimplemented);
  CHECK_THAT(Message(d.status()), Catch::Contains("\"rocm\""));
}

TEST_CASE("DecodeArenaBuffer: unknown dtype code", "[decode]") {
  Arena fx;
  auto b = DecodeBuffer(Buf(99, {4}, 0, 16), fx.arena, "arg 2");
  CHECK(b.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Message(b.status()) ==
        "arg 2: dtype code 99 is not an XLA FFI data type");
}

TEST_CASE("DecodeArenaBuffer: dtype without a byte width", "[decode]") {
  Arena fx;
  auto b = DecodeBuffer(Buf(XLA_FFI_DataType_S4, {4}, 0, 2), fx.arena, "arg 0");
  CHECK(b.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Message(b.status()) ==
        "arg 0: dtype S4 (code 21) has no byte width; kregd forwards only "
        "types of whole bytes");
  auto t = DecodeBuffer(Buf(XLA_FFI_DataType_TOKEN, {}, 0, 0), fx.arena, "r");
  CHECK_THAT(Message(t.status()), Catch::Contains("dtype TOKEN (code 17)"));
}

TEST_CASE("DecodeArenaBuffer: rank above the bound", "[decode]") {
  Arena fx;
  BufferSpec b = Buf(XLA_FFI_DataType_U8, {}, 0, 1);
  for (int i = 0; i < 65; ++i) b.add_dims(1);
  auto d = DecodeBuffer(b, fx.arena, "ret 1");
  CHECK(d.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Message(d.status()) == "ret 1: rank 65 exceeds the maximum of 64");
}

TEST_CASE("DecodeArenaBuffer: negative dim", "[decode]") {
  Arena fx;
  auto d = DecodeBuffer(Buf(XLA_FFI_DataType_F32, {2, -3}, 0, 24), fx.arena,
                        "arg 1");
  CHECK(d.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Message(d.status()) ==
        "arg 1: dims[1] = -3 is negative (dims [2, -3])");
}

TEST_CASE("DecodeArenaBuffer: element count overflow", "[decode]") {
  Arena fx;
  auto d = DecodeBuffer(
      Buf(XLA_FFI_DataType_F64, {int64_t{1} << 40, int64_t{1} << 30}, 0, 0),
      fx.arena, "arg 0");
  CHECK(d.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Message(d.status()) ==
        "arg 0: byte size of dims [1099511627776, 1073741824] overflows 64 "
        "bits");
}

TEST_CASE("DecodeArenaBuffer: dims do not match the byte size", "[decode]") {
  Arena fx;
  auto d =
      DecodeBuffer(Buf(XLA_FFI_DataType_F32, {2, 3}, 0, 20), fx.arena, "arg 0");
  CHECK(d.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Message(d.status()) ==
        "arg 0: dims [2, 3] of F32 need 24 bytes but the buffer has 20");
}

TEST_CASE("DecodeArenaBuffer: region past the arena", "[decode]") {
  Arena fx;
  auto d =
      DecodeBuffer(Buf(XLA_FFI_DataType_F32, {4}, 4090, 16), fx.arena, "ret 0");
  CHECK(d.status().code() == absl::StatusCode::kOutOfRange);
  CHECK(Message(d.status()) ==
        "ret 0: region [4090, 4106) ends past the session arena of 4096 "
        "bytes");
}

TEST_CASE("DecodeArenaBuffer: a buffer off XLA's 64-byte alignment",
          "[decode]") {
  Arena fx;
  auto d =
      DecodeBuffer(Buf(XLA_FFI_DataType_F32, {4}, 10, 16), fx.arena, "arg 1");
  CHECK(d.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Message(d.status()) ==
        "arg 1: arena offset 10 is not a multiple of 64 (buffers are 64-byte "
        "aligned, as XLA aligns them)");
  CHECK(DecodeBuffer(Buf(XLA_FFI_DataType_F32, {4}, 128, 16), fx.arena, "x")
            .ok());
  // An empty buffer has no data to align.
  CHECK(
      DecodeBuffer(Buf(XLA_FFI_DataType_F32, {0}, 10, 0), fx.arena, "x").ok());
}

TEST_CASE("DecodeArenaBuffer: offset + size overflow", "[decode]") {
  Arena fx;
  auto d = DecodeBuffer(Buf(XLA_FFI_DataType_U8, {16}, ~uint64_t{0} - 4, 16),
                        fx.arena, "arg 3");
  CHECK(d.status().code() == absl::StatusCode::kOutOfRange);
  CHECK(Message(d.status()) ==
        "arg 3: region offset 18446744073709551611 + size 16 overflows");
}

TEST_CASE("A socket descriptor: too many buffers", "[decode]") {
  Arena fx;
  LaunchSpec l = ScaleLaunch();
  for (int i = 0; i < kMaxLaunchBuffers; ++i) {
    *l.add_args() = Buf(XLA_FFI_DataType_U8, {0}, 0, 0);
  }
  auto d = SocketDecode(l, fx.arena);
  CHECK(d.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Message(d.status()) ==
        "launch has 4097 args and 1 rets; the maximum is 4096 each");
}

TEST_CASE("A socket descriptor: negative device ordinal", "[decode]") {
  Arena fx;
  LaunchSpec l = ScaleLaunch();
  l.set_device_ordinal(-1);
  auto d = SocketDecode(l, fx.arena);
  CHECK(Message(d.status()) == "device ordinal -1 is negative");
}

// ---- attributes ---------------------------------------------------------

v1::Attribute Scalar(const std::string& name, int dtype, std::string bytes) {
  v1::Attribute a;
  a.set_name(name);
  a.set_kind(v1::ATTR_KIND_SCALAR);
  a.set_dtype(dtype);
  a.set_data(std::move(bytes));
  return a;
}

absl::Status DecodeOne(const v1::Attribute& a) {
  google::protobuf::RepeatedPtrField<v1::Attribute> attrs;
  *attrs.Add() = a;
  return DecodeAttrs(attrs).status();
}

TEST_CASE("DecodeAttrs decodes every kind, nested", "[decode][attrs]") {
  google::protobuf::RepeatedPtrField<v1::Attribute> attrs;
  *attrs.Add() = Scalar("a", XLA_FFI_DataType_S64, std::string(8, '\1'));
  v1::Attribute* arr = attrs.Add();
  arr->set_name("b");
  arr->set_kind(v1::ATTR_KIND_ARRAY);
  arr->set_dtype(XLA_FFI_DataType_S32);
  arr->set_count(3);
  arr->set_data(std::string(12, '\2'));
  v1::Attribute* str = attrs.Add();
  str->set_name("c");
  str->set_kind(v1::ATTR_KIND_STRING);
  str->set_data(std::string("x\0y", 3));
  v1::Attribute* dict = attrs.Add();
  dict->set_name("d");
  dict->set_kind(v1::ATTR_KIND_DICT);
  *dict->add_dict() = Scalar("inner", XLA_FFI_DataType_PRED, "\1");
  auto d = DecodeAttrs(attrs);
  REQUIRE(d.ok());
  REQUIRE(d->size() == 4);
  CHECK((*d)[1].second.count == 3);
  CHECK((*d)[2].second.bytes == std::string("x\0y", 3));
  REQUIRE((*d)[3].second.dict.size() == 1);
  CHECK((*d)[3].second.dict[0].first == "inner");
}

TEST_CASE("DecodeAttrs: scalar of the wrong byte size", "[decode][attrs]") {
  absl::Status s = DecodeOne(Scalar("factor", XLA_FFI_DataType_F32, "abc"));
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message() ==
        "attribute factor: scalar of dtype F32 needs 4 bytes, got 3");
}

TEST_CASE("DecodeAttrs: scalar of an unknown dtype", "[decode][attrs]") {
  absl::Status s = DecodeOne(Scalar("x", 77, "a"));
  CHECK(s.message() ==
        "attribute x: dtype code 77 is not an XLA FFI data type");
}

TEST_CASE("DecodeAttrs: array count does not match its bytes",
          "[decode][attrs]") {
  v1::Attribute a;
  a.set_name("arr");
  a.set_kind(v1::ATTR_KIND_ARRAY);
  a.set_dtype(XLA_FFI_DataType_S64);
  a.set_count(2);
  a.set_data(std::string(15, '\0'));
  CHECK(DecodeOne(a).message() ==
        "attribute arr: array of 2 S64 elements does not match its 15 data "
        "bytes");
  a.set_count(-1);
  CHECK(DecodeOne(a).message() ==
        "attribute arr: array of -1 S64 elements does not match its 15 data "
        "bytes");
  a.set_count(int64_t{1} << 62);
  CHECK(DecodeOne(a).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("DecodeAttrs: unknown kind", "[decode][attrs]") {
  v1::Attribute a;
  a.set_name("k");
  a.set_kind(static_cast<v1::AttrKind>(9));
  CHECK(DecodeOne(a).message() == "attribute k: unknown attribute kind 9");
  a.set_kind(v1::ATTR_KIND_UNSPECIFIED);
  CHECK(DecodeOne(a).message() == "attribute k: unknown attribute kind 0");
}

TEST_CASE("DecodeAttrs: empty or overlong name", "[decode][attrs]") {
  CHECK(DecodeOne(Scalar("", XLA_FFI_DataType_U8, "a")).message() ==
        "attribute #0 name \"\" must be 1-256 bytes");
  absl::Status s =
      DecodeOne(Scalar(std::string(300, 'n'), XLA_FFI_DataType_U8, "a"));
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()), Catch::Contains("must be 1-256 bytes"));
}

TEST_CASE("DecodeAttrs: names not sorted or duplicated", "[decode][attrs]") {
  google::protobuf::RepeatedPtrField<v1::Attribute> attrs;
  *attrs.Add() = Scalar("b", XLA_FFI_DataType_U8, "a");
  *attrs.Add() = Scalar("a", XLA_FFI_DataType_U8, "a");
  CHECK(DecodeAttrs(attrs).status().message() ==
        "attribute names must be sorted and unique: \"a\" follows \"b\"");
  attrs.Clear();
  *attrs.Add() = Scalar("a", XLA_FFI_DataType_U8, "a");
  *attrs.Add() = Scalar("a", XLA_FFI_DataType_U8, "a");
  CHECK(DecodeAttrs(attrs).status().message() ==
        "attribute names must be sorted and unique: \"a\" follows \"a\"");
}

TEST_CASE("DecodeAttrs: errors inside dictionaries name the path",
          "[decode][attrs]") {
  v1::Attribute d;
  d.set_name("outer");
  d.set_kind(v1::ATTR_KIND_DICT);
  *d.add_dict() = Scalar("x", XLA_FFI_DataType_F64, "1234");
  CHECK(DecodeOne(d).message() ==
        "attribute outer.x: scalar of dtype F64 needs 8 bytes, got 4");
}

TEST_CASE("DecodeAttrs: dictionaries nested too deeply", "[decode][attrs]") {
  v1::Attribute root;
  root.set_name("d");
  root.set_kind(v1::ATTR_KIND_DICT);
  v1::Attribute* cur = &root;
  for (int i = 0; i < kMaxAttrDepth; ++i) {
    cur = cur->add_dict();
    cur->set_name("d");
    cur->set_kind(v1::ATTR_KIND_DICT);
  }
  absl::Status s = DecodeOne(root);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()),
             Catch::Contains("dictionaries nest deeper than 8 levels"));
}

TEST_CASE("DecodeAttrs: too many attributes", "[decode][attrs]") {
  google::protobuf::RepeatedPtrField<v1::Attribute> attrs;
  for (int i = 0; i <= kMaxLaunchAttrs; ++i) {
    char name[16];
    std::snprintf(name, sizeof(name), "a%06d", i);
    *attrs.Add() = Scalar(name, XLA_FFI_DataType_U8, "a");
  }
  CHECK(DecodeAttrs(attrs).status().message() ==
        "launch carries more than 4096 attributes");
}

}  // namespace
}  // namespace kreg
