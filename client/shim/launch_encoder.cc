#include "client/shim/launch_encoder.h"

#include <string.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/dtype.h"
#include "common/status_macros.h"

namespace kreg {
namespace shim {
namespace {

constexpr int kMaxDepth = 8;

}  // namespace

ClientStatus BufferBytes(const XLA_FFI_Buffer* b, const char* kind, int64_t i,
                         uint64_t* bytes) {
  int width = DtypeByteWidth(b->dtype);
  if (width <= 0) {
    return ClientStatus::Error(
        kInvalidArgument, std::string("kreg cannot forward ") + kind + " " +
                              std::to_string(i) + ": dtype " +
                              DtypeName(b->dtype) + " (code " +
                              std::to_string(b->dtype) + ") has no byte width");
  }
  uint64_t n = static_cast<uint64_t>(width);
  for (int64_t d = 0; d < b->rank; ++d) {
    if (b->dims[d] < 0 ||
        __builtin_mul_overflow(n, static_cast<uint64_t>(b->dims[d]), &n)) {
      return ClientStatus::Error(
          kInvalidArgument, std::string("kreg cannot forward ") + kind + " " +
                                std::to_string(i) + ": bad dims");
    }
  }
  *bytes = n;
  return ClientStatus::Ok();
}

bool DestroyXlaError(const XLA_FFI_Api* api, XLA_FFI_Error* e) {
  if (e == nullptr) return false;
  XLA_FFI_Error_Destroy_Args d;
  memset(&d, 0, sizeof(d));
  d.struct_size = XLA_FFI_Error_Destroy_Args_STRUCT_SIZE;
  d.error = e;
  api->XLA_FFI_Error_Destroy(&d);
  return true;
}

void CallContext(const XLA_FFI_CallFrame* f, int32_t* ordinal,
                 int64_t* run_id) {
  const XLA_FFI_Api* api = f->api;
  if (api->struct_size >= XLA_FFI_Api_STRUCT_SIZE) {
    XLA_FFI_DeviceOrdinal_Get_Args o;
    memset(&o, 0, sizeof(o));
    o.struct_size = XLA_FFI_DeviceOrdinal_Get_Args_STRUCT_SIZE;
    o.ctx = f->ctx;
    if (!DestroyXlaError(api, api->XLA_FFI_DeviceOrdinal_Get(&o))) {
      *ordinal = o.device_ordinal;
    }
    XLA_FFI_RunId_Get_Args r;
    memset(&r, 0, sizeof(r));
    r.struct_size = XLA_FFI_RunId_Get_Args_STRUCT_SIZE;
    r.ctx = f->ctx;
    if (!DestroyXlaError(api, api->XLA_FFI_RunId_Get(&r))) *run_id = r.run_id;
  }
}

ClientStatus EncodeAttrs(const XLA_FFI_Attrs* attrs,
                         google::protobuf::RepeatedPtrField<v1::Attribute>* out,
                         int depth) {
  if (depth > kMaxDepth) {
    return ClientStatus::Error(
        kInvalidArgument,
        "kreg cannot forward attribute dictionaries nested "
        "deeper than " +
            std::to_string(kMaxDepth));
  }
  for (int64_t i = 0; i < attrs->size; ++i) {
    v1::Attribute* a = out->Add();
    const XLA_FFI_ByteSpan* name = attrs->names[i];
    a->set_name(name->ptr, name->len);
    const void* value = attrs->attrs[i];
    switch (attrs->types[i]) {
      case XLA_FFI_AttrType_SCALAR: {
        auto* s = static_cast<const XLA_FFI_Scalar*>(value);
        int width = DtypeByteWidth(s->dtype);
        if (width <= 0) {
          return ClientStatus::Error(kInvalidArgument,
                                     "kreg cannot forward scalar attribute \"" +
                                         a->name() + "\" of dtype code " +
                                         std::to_string(s->dtype));
        }
        a->set_kind(v1::ATTR_KIND_SCALAR);
        a->set_dtype(s->dtype);
        a->set_data(static_cast<const char*>(s->value), width);
        break;
      }
      case XLA_FFI_AttrType_ARRAY: {
        auto* arr = static_cast<const XLA_FFI_Array*>(value);
        int width = DtypeByteWidth(arr->dtype);
        if (width <= 0) {
          return ClientStatus::Error(kInvalidArgument,
                                     "kreg cannot forward array attribute \"" +
                                         a->name() + "\" of dtype code " +
                                         std::to_string(arr->dtype));
        }
        a->set_kind(v1::ATTR_KIND_ARRAY);
        a->set_dtype(arr->dtype);
        a->set_count(static_cast<int64_t>(arr->size));
        a->set_data(static_cast<const char*>(arr->data), arr->size * width);
        break;
      }
      case XLA_FFI_AttrType_STRING: {
        auto* span = static_cast<const XLA_FFI_ByteSpan*>(value);
        a->set_kind(v1::ATTR_KIND_STRING);
        a->set_data(span->ptr, span->len);
        break;
      }
      case XLA_FFI_AttrType_DICTIONARY: {
        a->set_kind(v1::ATTR_KIND_DICT);
        KREG_RETURN_IF_ERROR(
            EncodeAttrs(static_cast<const XLA_FFI_Attrs*>(value),
                        a->mutable_dict(), depth + 1));
        break;
      }
      default:
        return ClientStatus::Error(
            kInvalidArgument, "kreg cannot forward attribute \"" + a->name() +
                                  "\" of type " +
                                  std::to_string(attrs->types[i]));
    }
  }
  return ClientStatus::Ok();
}

}  // namespace shim
}  // namespace kreg
