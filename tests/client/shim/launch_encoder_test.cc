// Client-side half of the session encoding (client/shim): attributes of
// every kind, including what JAX cannot lower (nested dictionaries, f16/bf16
// scalars, pred arrays), the buffers the shim refuses, and the forwarding
// handler's answers to XLA's metadata call and to wrong stages. The
// daemon-side decoder tests it mirrors are in tests/daemon/executor/
// (launch_fields_test, ring_decoder_test).
#include "client/shim/launch_encoder.h"

#include <cstring>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "client/shim/client.h"
#include "client/shim/forward.h"
#include "xla/ffi/api/c_api.h"

namespace kreg::shim {
namespace {

// Builds XLA_FFI_Attrs the way XLA lays them out.
struct AttrsBuilder {
  void Add(const char* name, XLA_FFI_AttrType type, void* value) {
    spans.push_back({name, std::strlen(name)});
    types.push_back(type);
    values.push_back(value);
  }
  XLA_FFI_Attrs* Build() {
    for (auto& s : spans) names.push_back(&s);
    attrs.struct_size = XLA_FFI_Attrs_STRUCT_SIZE;
    attrs.extension_start = nullptr;
    attrs.size = static_cast<int64_t>(types.size());
    attrs.types = types.data();
    attrs.names = names.data();
    attrs.attrs = values.data();
    return &attrs;
  }
  std::vector<XLA_FFI_ByteSpan> spans;
  std::vector<XLA_FFI_ByteSpan*> names;
  std::vector<XLA_FFI_AttrType> types;
  std::vector<void*> values;
  XLA_FFI_Attrs attrs;
};

TEST_CASE("EncodeAttrs: every kind, nested dictionaries, byte-exact",
          "[shim]") {
  uint16_t f16 = 0x3c00, bf16 = 0x4049;
  XLA_FFI_Scalar s_f16{XLA_FFI_DataType_F16, &f16};
  XLA_FFI_Scalar s_bf16{XLA_FFI_DataType_BF16, &bf16};
  bool preds[3] = {true, false, true};
  XLA_FFI_Array a_pred{XLA_FFI_DataType_PRED, 3, preds};
  double f64s[2] = {1.5, -2.0};
  XLA_FFI_Array a_f64{XLA_FFI_DataType_F64, 2, f64s};
  XLA_FFI_ByteSpan str{"a\0b", 3};

  AttrsBuilder inner;
  inner.Add("g", XLA_FFI_AttrType_ARRAY, &a_f64);
  AttrsBuilder middle;
  middle.Add("e", XLA_FFI_AttrType_SCALAR, &s_bf16);
  middle.Add("f", XLA_FFI_AttrType_DICTIONARY, inner.Build());
  AttrsBuilder top;
  top.Add("a", XLA_FFI_AttrType_SCALAR, &s_f16);
  top.Add("b", XLA_FFI_AttrType_ARRAY, &a_pred);
  top.Add("c", XLA_FFI_AttrType_STRING, &str);
  top.Add("d", XLA_FFI_AttrType_DICTIONARY, middle.Build());

  google::protobuf::RepeatedPtrField<v1::Attribute> out;
  REQUIRE(EncodeAttrs(top.Build(), &out).ok());
  REQUIRE(out.size() == 4);
  CHECK(out[0].name() == "a");
  CHECK(out[0].kind() == v1::ATTR_KIND_SCALAR);
  CHECK(out[0].dtype() == XLA_FFI_DataType_F16);
  CHECK(out[0].data() == std::string("\x00\x3c", 2));
  CHECK(out[1].kind() == v1::ATTR_KIND_ARRAY);
  CHECK(out[1].count() == 3);
  CHECK(out[1].data() == std::string("\x01\x00\x01", 3));
  CHECK(out[2].kind() == v1::ATTR_KIND_STRING);
  CHECK(out[2].data() == std::string("a\0b", 3));
  REQUIRE(out[3].kind() == v1::ATTR_KIND_DICT);
  REQUIRE(out[3].dict_size() == 2);
  CHECK(out[3].dict(0).name() == "e");
  CHECK(out[3].dict(0).data() == std::string("\x49\x40", 2));
  REQUIRE(out[3].dict(1).dict_size() == 1);
  const v1::Attribute& g = out[3].dict(1).dict(0);
  CHECK(g.name() == "g");
  CHECK(g.count() == 2);
  CHECK(g.data() == std::string(reinterpret_cast<char*>(f64s), 16));
}

TEST_CASE("EncodeAttrs: refuses dtypes without a byte width", "[shim]") {
  uint8_t v = 1;
  XLA_FFI_Scalar s4{XLA_FFI_DataType_S4, &v};
  AttrsBuilder b;
  b.Add("nibble", XLA_FFI_AttrType_SCALAR, &s4);
  google::protobuf::RepeatedPtrField<v1::Attribute> out;
  ClientStatus s = EncodeAttrs(b.Build(), &out);
  CHECK(s.code == kInvalidArgument);
  CHECK(s.message ==
        "kreg cannot forward scalar attribute \"nibble\" of dtype code 21");
}

// A stand-in for XLA's API table: only Error_Create is used on these paths.
std::string g_last_error;
XLA_FFI_Error_Code g_last_code;
XLA_FFI_Error* FakeErrorCreate(XLA_FFI_Error_Create_Args* args) {
  g_last_error = args->message;
  g_last_code = args->errc;
  return reinterpret_cast<XLA_FFI_Error*>(0x1);
}

struct Frame {
  Frame() {
    std::memset(&api, 0, sizeof(api));
    api.struct_size = 0;  // no optional calls (device ordinal, run id)
    api.XLA_FFI_Error_Create = &FakeErrorCreate;
    std::memset(&frame, 0, sizeof(frame));
    frame.struct_size = XLA_FFI_CallFrame_STRUCT_SIZE;
    frame.api = &api;
    frame.stage = XLA_FFI_ExecutionStage_EXECUTE;
    frame.args.struct_size = XLA_FFI_Args_STRUCT_SIZE;
    frame.rets.struct_size = XLA_FFI_Rets_STRUCT_SIZE;
    frame.attrs.struct_size = XLA_FFI_Attrs_STRUCT_SIZE;
  }
  XLA_FFI_Api api;
  XLA_FFI_CallFrame frame;
};

TEST_CASE("ForwardCall: a sub-byte buffer is refused before any I/O",
          "[shim]") {
  Client client("/nonexistent/kregd.sock.session");
  Frame f;
  int64_t dims[1] = {4};
  char data[4];
  XLA_FFI_Buffer buf{
      XLA_FFI_Buffer_STRUCT_SIZE, nullptr, XLA_FFI_DataType_U4, data, 1, dims};
  XLA_FFI_ArgType type = XLA_FFI_ArgType_BUFFER;
  void* args[1] = {&buf};
  f.frame.args.size = 1;
  f.frame.args.types = &type;
  f.frame.args.args = args;
  ClientStatus s = ForwardCall(&client, "t", "cpu", &f.frame);
  CHECK(s.code == kInvalidArgument);
  CHECK(s.message ==
        "kreg cannot forward arg 0: dtype U4 (code 22) has no byte width");
}

TEST_CASE("ForwardCall: CUDA without a driver says so", "[shim]") {
  Client client("/nonexistent/kregd.sock.session");
  Frame f;
  ClientStatus s = ForwardCall(&client, "t", "cuda", &f.frame);
  CHECK(s.code == kUnavailable);
  CHECK(s.message.rfind("kreg: forwarding CUDA call of \"t\": no CUDA driver",
                        0) == 0);
}

TEST_CASE("ForwardCall: daemon not running is UNAVAILABLE with the path",
          "[shim]") {
  Client client("/nonexistent/kregd.sock.session");
  Frame f;
  ClientStatus s = ForwardCall(&client, "t", "cpu", &f.frame);
  CHECK(s.code == kUnavailable);
  CHECK(s.message ==
        "cannot connect to the kregd session socket "
        "/nonexistent/kregd.sock.session: No such file or directory (is "
        "kregd running?). Start it with `kregd --socket "
        "/nonexistent/kregd.sock` or `systemctl start kregd`");
}

TEST_CASE("Forwarding handler answers XLA's metadata call", "[shim]") {
  Client client("/nonexistent/meta.session");
  Binding b;
  REQUIRE(Bind(&client, "meta.target", "CPU", 0, &b).ok());
  Binding again;
  REQUIRE(Bind(&client, "meta.target", "host", 0, &again).ok());
  CHECK(again.handler == b.handler);
  Frame f;
  XLA_FFI_Metadata metadata;
  std::memset(&metadata, 0xff, sizeof(metadata));
  metadata.struct_size = XLA_FFI_Metadata_STRUCT_SIZE;
  XLA_FFI_Metadata_Extension ext;
  ext.extension_base.struct_size = XLA_FFI_Metadata_Extension_STRUCT_SIZE;
  ext.extension_base.type = XLA_FFI_Extension_Metadata;
  ext.extension_base.next = nullptr;
  ext.metadata = &metadata;
  f.frame.extension_start = &ext.extension_base;
  auto* handler = reinterpret_cast<XLA_FFI_Handler*>(b.handler);
  CHECK(handler(&f.frame) == nullptr);
  CHECK(metadata.api_version.major_version == XLA_FFI_API_MAJOR);
  CHECK(metadata.api_version.minor_version == XLA_FFI_API_MINOR);
  CHECK(metadata.traits == 0);  // not command-buffer compatible
  CHECK(metadata.state_type_id.type_id == 0);
}

TEST_CASE("Forwarding handler refuses the stages it does not forward",
          "[shim]") {
  Client client("/nonexistent/stage.session");
  Binding b;
  REQUIRE(Bind(&client, "stage.target", "cpu", 0, &b).ok());
  Frame f;
  // Record is never forwarded; instantiate only for a stateful binding.
  f.frame.stage = XLA_FFI_ExecutionStage_RECORD;
  auto* handler = reinterpret_cast<XLA_FFI_Handler*>(b.handler);
  CHECK(handler(&f.frame) != nullptr);
  CHECK(g_last_code == XLA_FFI_Error_Code_INVALID_ARGUMENT);
  CHECK(g_last_error ==
        "kreg forwarding handler for \"stage.target\" does not forward "
        "stage 4 (it forwards prepare, initialize and execute)");
  f.frame.stage = XLA_FFI_ExecutionStage_INSTANTIATE;
  CHECK(handler(&f.frame) != nullptr);
  CHECK(g_last_error ==
        "kreg forwarding handler for \"stage.target\" does not forward "
        "stage 0 (it forwards prepare, initialize and execute)");
  Binding s;
  REQUIRE(
      Bind(&client, "stage.stateful", "cpu", 0, &s, /*stateful=*/true).ok());
  auto* stateful = reinterpret_cast<XLA_FFI_Handler*>(s.handler);
  f.frame.stage = XLA_FFI_ExecutionStage_RECORD;
  CHECK(stateful(&f.frame) != nullptr);
  CHECK(g_last_error ==
        "kreg forwarding handler for \"stage.stateful\" does not forward "
        "stage 4 (it forwards instantiate, prepare, initialize and execute)");
  // The same pair cannot be bound both ways.
  CHECK(Bind(&client, "stage.target", "cpu", 0, &b, /*stateful=*/true)
            .message.find("is already bound in this process without an "
                          "instantiate stage") != std::string::npos);
}

TEST_CASE("Binding a target to a second daemon is refused", "[shim]") {
  Client one("/nonexistent/one.session"), two("/nonexistent/two.session");
  Binding b;
  REQUIRE(Bind(&one, "two.daemons", "cpu", 0, &b).ok());
  ClientStatus s = Bind(&two, "two.daemons", "cpu", 0, &b);
  CHECK(s.code == kFailedPrecondition);
  CHECK(s.message ==
        "target \"two.daemons\" (cpu) is already bound to the kregd at "
        "/nonexistent/one.session; a process can forward a target to one "
        "daemon only");
}

}  // namespace
}  // namespace kreg::shim
